"""Files kgen reads and names it writes, checked before use.

Every file kgen reads (a spec, a target it may overwrite, a cached module or tuning file) is
opened by ``open_regular``: a named pipe (FIFO) opened for reading blocks until a writer comes,
so a path is opened non-blocking and refused unless it is a regular file.  ``name_problem`` says
why a path cannot be created (a name longer than the file system takes), so that a build can
refuse it before anything is written rather than fail half-way with an OSError.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import stat
import threading
from pathlib import Path
from typing import IO, Iterator

from .errors import KgenError

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)    # absent on Windows, which has no FIFOs to block on
_NAME_MAX, _PATH_MAX = 255, 4096            # Linux's, where pathconf cannot say


@contextlib.contextmanager
def held_signals(*signums: int) -> Iterator[None]:
    """Run the block with ``signums`` (Ctrl-C's SIGINT, SIGTERM) noted, not acted on; each one
    that came is raised again once the block is over, to its own handler (Ctrl-C then raises
    KeyboardInterrupt), so that a file write or an import is never cut half-way.  Only the
    main thread takes handlers: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    before = {n: signal.signal(n, lambda number, _frame: came.append(number)) for n in signums}
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(n, signal.SIG_DFL if handler is None else handler)   # None: set outside Python
        for n in dict.fromkeys(came):
            signal.raise_signal(n)


class NotRegularFile(KgenError):
    """A path to read is a folder, a FIFO, a socket or a device, not a regular file."""


def new_temp(folder: str, suffix: str) -> tuple[int, str]:
    """A new file in ``folder`` that a rename will put in place: (descriptor, path).  Made with
    open()'s mode, 0o666 less the umask the process has now (the system applies it; mkstemp's
    would be 0o600), and never through a link (O_EXCL)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        path = os.path.join(folder, f".kgen-{secrets.token_hex(6)}{suffix}")   # short: any name fits
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue


def display_path(path: str | os.PathLike) -> str:
    """Relative to the working directory where possible, with forward slashes.  Links are kept
    (a symlinked spec keeps its own name), but '..' is taken where the file system takes it:
    after a symlinked folder it leads out of the folder linked to, not back up the path."""
    absolute = os.path.abspath(path)
    if ".." in Path(path).parts:
        joined = os.path.join(os.getcwd(), path)
        head, name = os.path.split(joined)
        absolute = os.path.realpath(joined) if name in ("", ".", "..") else \
            os.path.join(os.path.realpath(head), name)
    try:
        return Path(absolute).relative_to(os.getcwd()).as_posix()
    except ValueError:
        return Path(path).as_posix()


def file_kind(mode: int) -> str:
    """What a stat mode is, in words ("a folder", "a named pipe (FIFO)", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: str | os.PathLike, mode: str = "rb", expected: str = "a regular file", **kwargs) -> IO:
    """``path`` opened for reading (``mode`` "rb" or "r", ``kwargs`` as ``open`` takes them) if it is
    a regular file; a ``NotRegularFile`` naming what it is otherwise, without blocking on a FIFO.
    An OSError (missing, unreadable, a name too long) is the caller's to word."""
    if mode not in ("r", "rb"):
        raise ValueError(f"open_regular reads only, got mode {mode!r}")
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        kind = existing_kind(path)    # a socket cannot be opened at all; an unreadable folder is a folder
        if kind is not None and kind != "a regular file":
            raise NotRegularFile(f"{display_path(path)}: expected {expected}, got {kind}") from None
        raise
    try:
        mode_bits = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode_bits):
            raise NotRegularFile(f"{display_path(path)}: expected {expected}, got {file_kind(mode_bits)}")
        if _NONBLOCK:   # reads of a regular file never block; clear the flag all the same
            os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, expected: str = "a regular file", limit: int = -1) -> bytes:
    """The bytes of a regular file (see ``open_regular``), at most ``limit`` of them where one is
    given: a file of other content may be as large as the disk, more than memory holds."""
    with open_regular(path, "rb", expected) as f:
        return f.read(limit)


def existing_kind(path: str | os.PathLike) -> str | None:
    """What is at ``path`` (links followed), or None where nothing is (or it cannot be told)."""
    try:
        return file_kind(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def folder_problem(out: Path) -> str | None:
    """Why ``out`` cannot be the folder a build writes into, or None: it, or the nearest path
    above it that is there, is not a folder (a file, ``-o file/sub`` too), or it is a link to
    nothing, or lies under one (which the build could neither follow nor make)."""
    above = next((p for p in (out, *out.parents) if os.path.lexists(p)), None)
    if above is not None and os.path.islink(above) and not os.path.exists(above):
        return f"{display_path(above)} is a symbolic link ({os.readlink(above)}) that leads to no folder to write into"
    if above is not None and not os.path.isdir(above):
        return f"{display_path(above)} is a file, not a folder to write into"
    return None


def name_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be created on its file system, or None: a component of more bytes than
    a name may have there, or the whole path past the longest it takes."""
    absolute = os.path.abspath(path)
    anchor = _existing_ancestor(absolute)
    name_max = _pathconf(anchor, "PC_NAME_MAX", _NAME_MAX)
    for part in Path(absolute).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            return (f"the name {abridged(part)} is {size} bytes long; the file system takes at most "
                    f"{name_max}")
    path_max = _pathconf(anchor, "PC_PATH_MAX", _PATH_MAX)
    if len(os.fsencode(absolute)) >= path_max:
        return f"the path is {len(os.fsencode(absolute))} bytes long; the file system takes fewer than {path_max}"
    return None


def check_name(path: str | os.PathLike, option: str) -> None:
    """A KgenError naming ``option`` where ``path`` cannot be created (``name_problem``)."""
    why = name_problem(path)
    if why:
        raise KgenError(f"{option}: {abridged(display_path(path))}: {why}")


def _existing_ancestor(absolute: str) -> str:
    """The nearest folder above (or at) ``absolute`` that exists: the file system a new name joins."""
    here = absolute
    while not os.path.isdir(here):
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return here


def _pathconf(folder: str, name: str, default: int) -> int:
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):   # no pathconf (Windows), or no such limit
        return default
    return value if value and value > 0 else default


def abridged(text: str, keep: int = 60) -> str:
    """A long name shown by its ends, so that a message stays one readable line."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...{text[-keep // 2:]}"
