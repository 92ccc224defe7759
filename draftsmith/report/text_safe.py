"""Strings from result files reach the terminal and Markdown: terminal escapes in them (ANSI CSI
colour and cursor codes, OSC titles and hyperlinks, other ESC sequences) and control characters
are removed, so a received result cannot rewrite the screen, set the window title or hide text.

    print(plain_text(text))     # newlines and tabs stay, everything else below 0x20 (and 0x7f-0x9f) goes
"""
from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC ... BEL or ST (title, hyperlink); unterminated: to the end
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI (colours, cursor moves, erase)
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b.?"  # any other ESC sequence
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # the remaining control characters (\t and \n stay)
)


def plain_text(text: str) -> str:
    return _ESCAPES.sub("", str(text))
