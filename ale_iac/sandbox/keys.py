"""Key names: what agents write (``Return``, ``ArrowUp``, ``Control``, ``PageDown``, ``ctrl+c``) mapped to
the names the computer-server's keyboard backend accepts (pynput ``Key`` attribute names, or one character).

The server (0.3.x on Linux) resolves a key with ``getattr(pynput.keyboard.Key, name)`` or, for a
one-character string, the character itself, and rejects anything else with ``Unknown key``. Normalizing
and validating here gives an agent one clear error before anything is sent, and one set of names that works
on every backend.
"""

from __future__ import annotations

CANONICAL_KEYS: frozenset[str] = frozenset(
    {
        "alt", "alt_l", "alt_r", "alt_gr", "backspace", "caps_lock", "cmd", "cmd_l", "cmd_r",
        "ctrl", "ctrl_l", "ctrl_r", "delete", "down", "end", "enter", "esc", "home", "left",
        "page_down", "page_up", "right", "shift", "shift_l", "shift_r", "space", "tab", "up",
        "insert", "menu", "num_lock", "pause", "print_screen", "scroll_lock",
        "media_play_pause", "media_volume_mute", "media_volume_down", "media_volume_up",
        "media_previous", "media_next",
        *(f"f{n}" for n in range(1, 21)),
    }
)  # fmt: skip
"""The pynput ``Key`` names the server understands (besides single characters)."""

# Keyed by the compact form (lower case, no ``_``/``-``/space), so ``Page_Down``, ``page-down`` and
# ``PageDown`` all land on the same entry. Covers browser (``ArrowUp``), X keysym (``Prior``,
# ``BackSpace``, ``Super_L``), macOS (``option``, ``command``) and Windows (``win``) spellings.
_ALIASES: dict[str, str] = {
    "control": "ctrl", "ctl": "ctrl", "controll": "ctrl_l", "controlr": "ctrl_r",
    "lctrl": "ctrl_l", "rctrl": "ctrl_r", "leftctrl": "ctrl_l", "rightctrl": "ctrl_r",
    "return": "enter", "ret": "enter", "kpenter": "enter", "newline": "enter",
    "escape": "esc",
    "option": "alt", "opt": "alt", "menualt": "alt", "lalt": "alt_l", "ralt": "alt_r", "altgraph": "alt_gr",
    "modeswitch": "alt_gr",
    "meta": "cmd", "command": "cmd", "win": "cmd", "windows": "cmd", "super": "cmd", "os": "cmd",
    "metal": "cmd_l", "metar": "cmd_r", "superl": "cmd_l", "superr": "cmd_r",
    "lwin": "cmd_l", "rwin": "cmd_r",
    "lshift": "shift_l", "rshift": "shift_r", "leftshift": "shift_l", "rightshift": "shift_r",
    "arrowup": "up", "arrowdown": "down", "arrowleft": "left", "arrowright": "right",
    "uparrow": "up", "downarrow": "down", "leftarrow": "left", "rightarrow": "right",
    "pgup": "page_up", "pgdn": "page_down", "pgdown": "page_down", "prior": "page_up", "next": "page_down",
    "del": "delete", "forwarddelete": "delete", "ins": "insert",
    "bksp": "backspace", "bs": "backspace",
    "spacebar": "space",
    "capital": "caps_lock", "numlk": "num_lock", "scrlk": "scroll_lock",
    "print": "print_screen", "prtsc": "print_screen", "prtscr": "print_screen", "printscr": "print_screen",
    "snapshot": "print_screen",
    "break": "pause",
    "apps": "menu", "contextmenu": "menu",
}  # fmt: skip

_CHARACTER_NAMES: dict[str, str] = {" ": "space", "\n": "enter", "\r": "enter", "\t": "tab", "\x1b": "esc"}


def _compact(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "").replace(" ", "")


_BY_COMPACT: dict[str, str] = {_compact(k): k for k in CANONICAL_KEYS} | _ALIASES

VALID_KEYS_HINT = (
    "ctrl, shift, alt, cmd (meta/super/win), enter, esc, tab, space, backspace, delete, insert, "
    "up, down, left, right, home, end, page_up, page_down, f1-f20, or a single character"
)


class UnknownKeyError(ValueError):
    """A key name that maps to nothing the server can press; the message names the key."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"unknown key name {key!r} (use {VALID_KEYS_HINT})")


def normalize_key(key: str) -> str:
    """Map one key name to the server's name; raises :class:`UnknownKeyError`.

    Idempotent: a canonical name maps to itself. A single letter is lower-cased (``["ctrl", "C"]`` means
    ctrl+c, as in the old bridge); use ``type`` for upper-case text.
    """
    if len(key) == 1:
        return _CHARACTER_NAMES.get(key, key.lower())
    if not key.strip():
        raise UnknownKeyError(key)
    if len(key.strip()) == 1:  # " a " -> "a"; a lone space was handled above
        return normalize_key(key.strip())
    canonical = _BY_COMPACT.get(_compact(key.strip()))
    if canonical is None:
        raise UnknownKeyError(key)
    return canonical


def split_combo(keys: list[str]) -> list[str]:
    """Expand ``"ctrl+c"``-style items into separate keys; a literal plus is ``"+"`` or ends in ``"++"``."""
    out: list[str] = []
    for item in keys:
        if len(item) <= 1 or "+" not in item:
            out.append(item)
            continue
        body, tail = (item[:-2], ["+"]) if item.endswith("++") else (item, [])
        parts = body.split("+") if body else []
        if any(not p.strip() for p in parts):
            raise UnknownKeyError(item)
        out.extend([*parts, *tail])
    return out


def normalize_keys(keys: list[str]) -> list[str]:
    """Split combos and normalize each key; raises :class:`UnknownKeyError` on the first bad name."""
    if not keys:
        raise ValueError("keys must name at least one key")
    return [normalize_key(k) for k in split_combo(keys)]
