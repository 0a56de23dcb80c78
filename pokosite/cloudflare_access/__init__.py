"""Cloudflare Access authentication: every HTTP request and WebSocket connect carries a signed
Access JWT, verified here, and mapped to a Django user.

    config.py              the CF_ACCESS_* settings, validated, as one frozen AccessConfig
    tokens.py              the JWT: where it is read from, RS256 verification against the team's
                           JWKS (PyJWT's PyJWKClient), the AccessIdentity it proves
    users.py               identity -> Django user (created on first visit; staff from allow-lists)
    gate.py                one decision for both protocols: token + path -> (user, identity)
    middleware.py          Django HTTP middleware (403 on refusal; /healthz stays open)
    websocket.py           Channels middleware for WebSocket connects
    authentication.py      DRF authentication class (CSRF for browsers, none for service tokens)
    context_processors.py  `cf_access_enabled` for the "running without Access" notice

Off (nothing checked, Django's own logins apply) unless CF_ACCESS_TEAM_DOMAIN and CF_ACCESS_AUD
are both set.
"""
