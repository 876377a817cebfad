"""The job's state directory, checked before anything starts; without torch, so that the launcher (which
starts the ranks and never trains) does not pay its import on every generation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_state_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if missing and make sure files can be created in it; return it as a ``Path``.

    Raises ``ValueError`` when ``path`` (or a parent) is not a directory and ``PermissionError`` when
    the directory cannot be created or written, both naming the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"state directory {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except PermissionError as e:
        raise PermissionError(f"cannot create state directory {path}: {e.strerror or e}") from e
    except (FileExistsError, NotADirectoryError) as e:
        raise ValueError(f"cannot create state directory {path}: a parent is not a directory ({e})") from e
    except OSError as e:
        raise PermissionError(f"cannot create state directory {path}: {e.strerror or e}") from e
    try:  # a real probe: os.access is wrong for root and on some file systems (read-only mounts, ACLs)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PermissionError(f"state directory {path} is not writable: {e.strerror or e}") from e
    return path
