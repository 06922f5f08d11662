"""The user's cache folder for this package: compiled step functions (``jit``) and parsed YAML.

Everything here is an optimization that may be lost at any time: a folder that cannot be made or
written means no cache, never an error. The folder is ``$XDG_CACHE_HOME/deepinfer-sim/<name>``
(by default under ``~/.cache``), never beside the installed modules, which ``pip uninstall``
would leave behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
from typing import Any

_DIGEST = 32  # sha256


def cache_folder(name: str) -> str:
    """The folder for ``name``'s files, made if needed; "" when it cannot be made or written."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "deepinfer-sim", name)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return ""
    return folder if os.access(folder, os.W_OK) else ""


class ParsedFiles:
    """Parsed documents kept by the bytes they were parsed from: a file read again with the same
    content is loaded from its entry (the default scenario's 199 kB calibration profile: 44–68 ms
    through libyaml, 1.0–1.2 ms from the cache).

    Entries are ``marshal`` data (plain dicts, lists, strings and numbers, exactly as parsed),
    named by a digest of the source bytes and of ``parser`` (the parser and its version), with
    the digest of their own bytes in front: a damaged entry is a miss."""

    def __init__(self, name: str, parser: str) -> None:
        self.name = name
        self.tag = f"{parser}|python {sys.version_info[0]}.{sys.version_info[1]}".encode()

    def _path(self, raw: bytes) -> str:
        folder = cache_folder(self.name)
        if not folder:
            return ""
        return os.path.join(folder, hashlib.sha256(self.tag + raw).hexdigest() + ".marshal")

    def load(self, raw: bytes) -> tuple[bool, Any]:
        """(True, document) when ``raw`` was parsed before, else (False, None)."""
        path = self._path(raw)
        if not path:
            return False, None
        try:
            with open(path, "rb") as f:
                blob = f.read()
            payload = blob[_DIGEST:]
            if hashlib.sha256(payload).digest() != blob[:_DIGEST]:
                return False, None
            return True, marshal.loads(payload)
        except (OSError, EOFError, ValueError, TypeError):
            return False, None

    def store(self, raw: bytes, document: Any) -> None:
        """Keep ``document`` as what ``raw`` parses to (nothing when it holds other types than
        marshal's, or the folder cannot be written)."""
        path = self._path(raw)
        if not path:
            return
        try:
            payload = marshal.dumps(document)
        except ValueError:
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "wb") as f:
                f.write(hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
