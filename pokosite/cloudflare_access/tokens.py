"""The Access JWT: where a request carries it, how it is verified, and who it proves.

Verification: the header names RS256 (anything else, HS256 and `none` included, is refused before
any key is looked up) and a key id; the key comes from the team's JWKS through PyJWT's
PyJWKClient, whose key set is cached for `jwks_lifespan_s` and fetched again when a token names a
key id it does not hold (at most once per `jwks_cooldown_s`), so a rotated key is picked up; then
the signature, `aud` (must contain one of the AUD tags), `iss` (must equal the team domain), and
`exp` / `nbf` / `iat` with `leeway_s` of clock skew.

A refusal is an AccessDenied whose reason is short and fixed ("expired", "wrong audience", ...):
it goes to the log, the token never does.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import jwt

logger = logging.getLogger(__name__)

HEADER_NAME = "Cf-Access-Jwt-Assertion"
COOKIE_NAME = "CF_Authorization"
ALGORITHM = "RS256"
# Access tokens are ~1 KB; anything far larger is not one, and is not worth parsing.
MAX_TOKEN_CHARS = 16_384


class AccessDenied(Exception):
    """The request may not pass; `reason` is safe to log."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AccessIdentity:
    """Who a verified token speaks for: a person (email) or a service token (common_name)."""

    subject: str
    email: str | None  # casefolded; None for a service token
    common_name: str | None  # a service token's client id; None for a person
    groups: tuple[str, ...]  # Access / IdP group names or ids the token lists, if any

    @property
    def is_service(self) -> bool:
        return self.email is None

    def __str__(self) -> str:
        return self.email or f"service token {self.common_name}"


def token_pick(header_value: str | None, cookie_value: str | None) -> str | None:
    """The header when there is one (Access sets it on every request it lets through), else the
    cookie a browser sends; None when neither carries anything."""
    for value in (header_value, cookie_value):
        if value and value.strip():
            return value.strip()
    return None


def _groups(claims: dict) -> tuple[str, ...]:
    # Access passes IdP groups through as a `groups` claim: names, or {"id", "name"} objects.
    raw = claims.get("groups")
    if raw is None and isinstance(claims.get("custom"), dict):
        raw = claims["custom"].get("groups")
    if not isinstance(raw, list):
        return ()
    names: list[str] = []
    for group in raw:
        if isinstance(group, str):
            names.append(group)
        elif isinstance(group, dict):
            names.extend(str(group[k]) for k in ("name", "id") if group.get(k))
    return tuple(names)


def identity_from_claims(claims: dict) -> AccessIdentity:
    email = claims.get("email")
    common_name = claims.get("common_name")
    if isinstance(email, str) and email.strip():
        return AccessIdentity(
            subject=str(claims.get("sub") or ""),
            email=email.strip().casefold(),
            common_name=None,
            groups=_groups(claims),
        )
    if isinstance(common_name, str) and common_name.strip():
        return AccessIdentity(
            subject=str(claims.get("sub") or ""),
            email=None,
            common_name=common_name.strip(),
            groups=(),
        )
    raise AccessDenied("no email or common_name claim")


class AccessTokenVerifier:
    """Verifies Access JWTs for one team and application; one per process (see verifier_for),
    so its key set cache is shared by every request and connect."""

    def __init__(
        self,
        *,
        certs_url: str,
        issuer: str,
        audiences: tuple[str, ...],
        leeway_s: int,
        jwks_lifespan_s: int,
        jwks_cooldown_s: int,
    ):
        self.issuer = issuer
        self.audiences = list(audiences)
        self.leeway_s = leeway_s
        # The key URL comes from settings only, never from a token's `jku`/`x5u` header.
        # No per-kid key cache (cache_keys): it never expires, so a key the team withdrew would
        # stay trusted. The key set cache expires after `lifespan`.
        self.jwks_client = jwt.PyJWKClient(
            certs_url,
            cache_jwk_set=True,
            lifespan=jwks_lifespan_s,
            cooldown_duration=jwks_cooldown_s,
            timeout=10,
        )

    def verify(self, token: str) -> AccessIdentity:
        if len(token) > MAX_TOKEN_CHARS:
            raise AccessDenied("malformed")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise AccessDenied("malformed") from None
        if header.get("alg") != ALGORITHM:
            raise AccessDenied(f"algorithm {str(header.get('alg'))[:16]!r} is not RS256")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise AccessDenied("no key id")
        key = self._signing_key(kid)
        if key.key_type != "RSA":
            raise AccessDenied("key is not RSA")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[ALGORITHM],
                audience=self.audiences,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise AccessDenied("expired") from None
        except jwt.ImmatureSignatureError:
            raise AccessDenied("not yet valid") from None
        except jwt.InvalidAudienceError:
            raise AccessDenied("wrong audience") from None
        except jwt.InvalidIssuerError:
            raise AccessDenied("wrong issuer") from None
        except jwt.InvalidSignatureError:
            raise AccessDenied("bad signature") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AccessDenied(f"no {exc.claim} claim") from None
        except jwt.InvalidTokenError:
            raise AccessDenied("malformed") from None
        return identity_from_claims(claims)

    def _signing_key(self, kid: str) -> jwt.PyJWK:
        try:
            return self.jwks_client.get_signing_key(kid)
        except jwt.PyJWKClientConnectionError as exc:
            # Fail closed: without the keys nothing can be verified.
            logger.error("Access keys could not be fetched: %s", exc)
            raise AccessDenied("keys unavailable") from None
        except jwt.PyJWKClientError:
            raise AccessDenied("unknown key id") from None
        except jwt.PyJWKSetError as exc:
            logger.error("Access key set is unusable: %s", exc)
            raise AccessDenied("keys unavailable") from None


@functools.lru_cache(maxsize=8)
def verifier_for(
    *,
    certs_url: str,
    issuer: str,
    audiences: tuple[str, ...],
    leeway_s: int,
    jwks_lifespan_s: int,
    jwks_cooldown_s: int,
) -> AccessTokenVerifier:
    """The process's verifier for these settings (a new one only when they change)."""
    return AccessTokenVerifier(
        certs_url=certs_url,
        issuer=issuer,
        audiences=audiences,
        leeway_s=leeway_s,
        jwks_lifespan_s=jwks_lifespan_s,
        jwks_cooldown_s=jwks_cooldown_s,
    )
