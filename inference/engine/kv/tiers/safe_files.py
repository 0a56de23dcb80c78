"""Files in a directory other machines write (the disk tier's shared mount), reached without
trusting what is there: every entry below the root is opened relative to its parent's file
descriptor with O_NOFOLLOW, so no link leads a read, a write or a delete out of the directory;
only regular files are read (a FIFO, a device or a socket is refused before it is opened, and
again after, by fstat: opening a FIFO would block until a writer came), and no read goes past a
size bound. A read that hangs in the kernel (a stuck network mount) cannot be bounded here: the
loader gives it up (loader.py, offloader.py).

A path is the root (the operator's: it may itself be a link or a mount) and the names below it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator, Sequence

_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_DIR_FLAGS = _ROOT_FLAGS | os.O_NOFOLLOW
# O_NONBLOCK: should a FIFO appear between the check and the open, opening it returns at once.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Opening a link with O_NOFOLLOW, or a non-directory with O_DIRECTORY; a socket.
_NOT_OURS = {errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EMLINK}
_CHUNK = 1 << 20


class UnsafeFileError(OSError):
    """An entry that is not what the directory should hold (a link, a special file, a file too
    large): never read; `names` lead to it from the root, for `remove`."""

    def __init__(self, message: str, names: Sequence[str]) -> None:
        super().__init__(f"{os.path.join(*names)}: {message}")
        self.names = tuple(names)


@contextlib.contextmanager
def directory(root: str, names: Sequence[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of root/names..., reached without following links (made when `create`)."""
    fd = os.open(root, _ROOT_FLAGS)
    try:
        for i, name in enumerate(names):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
                child = _open_dir(fd, names[: i + 1])
            except OSError as exc:
                raise _unsafe(exc, "not a directory (a link or a file)", names[: i + 1]) from exc
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read_regular(root: str, names: Sequence[str], max_bytes: int) -> bytes:
    """The bytes of the regular file root/names..., at most `max_bytes` of them.
    Raises FileNotFoundError, UnsafeFileError, or OSError (an I/O error)."""
    with directory(root, names[:-1]) as dir_fd:
        name = names[-1]
        _check_regular(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), names, max_bytes)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _unsafe(exc, "not a regular file", names) from exc
    try:
        _check_regular(os.fstat(fd), names, max_bytes)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise UnsafeFileError(f"grew past {max_bytes} bytes while read", names)
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_regular(root: str, names: Sequence[str]) -> bool:
    """Whether root/names... is a regular file (False when missing or anything else)."""
    try:
        with directory(root, names[:-1]) as dir_fd:
            info = os.stat(names[-1], dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode)


def touch(root: str, names: Sequence[str]) -> None:
    """Set the entry's mtime to now (its last use), not following a link. Raises OSError."""
    with directory(root, names[:-1]) as dir_fd:
        os.utime(names[-1], dir_fd=dir_fd, follow_symlinks=False)


def remove(root: str, names: Sequence[str]) -> bool:
    """Delete the entry root/names... (a link itself, never what it points to); False if it
    could not be deleted (gone already, a directory, no permission)."""
    try:
        with directory(root, names[:-1]) as dir_fd:
            os.unlink(names[-1], dir_fd=dir_fd)
        return True
    except OSError:
        return False


def write_atomic(root: str, names: Sequence[str], data: bytes) -> None:
    """Write `data` to root/names... whole or not at all: a new temporary file beside it (never
    an existing entry, never through a link), then a rename over whatever the name held.
    Directories on the way are made; one that is a link or a file is replaced by a directory.
    Raises OSError (the temporary is removed)."""
    try:
        _write_atomic(root, names, data)
    except UnsafeFileError as exc:  # a planted link or file where a directory belongs
        remove(root, exc.names)
        _write_atomic(root, names, data)


def _write_atomic(root: str, names: Sequence[str], data: bytes) -> None:
    with directory(root, names[:-1], create=True) as dir_fd:
        name = names[-1]
        temporary = f"{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(temporary, _CREATE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=dir_fd)
            raise


def walk(root: str) -> Iterator[tuple[tuple[str, ...], os.stat_result]]:
    """(names, lstat) of every file below root, links not followed (nor listed, when they
    point to a directory)."""
    for path, _, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        relative = os.path.relpath(path, root)
        parents = () if relative == os.curdir else tuple(relative.split(os.sep))
        for name in files:
            try:
                yield (*parents, name), os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue


def _open_dir(fd: int, names: Sequence[str]) -> int:
    try:
        return os.open(names[-1], _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise _unsafe(exc, "not a directory (a link or a file)", names) from exc


def _check_regular(info: os.stat_result, names: Sequence[str], max_bytes: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "a FIFO, device, socket or directory"
        raise UnsafeFileError(f"not a regular file ({kind})", names)
    if info.st_size > max_bytes:
        raise UnsafeFileError(f"{info.st_size} bytes, more than a valid file's {max_bytes}", names)


def _unsafe(exc: OSError, message: str, names: Sequence[str]) -> OSError:
    """`exc` as an UnsafeFileError when it says the entry is not what it should be."""
    if exc.errno in _NOT_OURS:
        return UnsafeFileError(message, names)
    return exc
