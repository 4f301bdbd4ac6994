"""The console's palette meets WCAG 2.1 AA contrast, computed from ``console.css`` itself.

Every rule of the stylesheet that sets a text colour is paired with the background it is
drawn on: the rule's own ``background`` when it has one, the header's for rules inside
``header.top``, and otherwise both surfaces any text may sit on (the page, ``--bg``, and
the panels of cards, table heads and figures, ``--panel``). A rule that sets only a
background is paired with the text colour it inherits (the page's, or the buttons'). Text
needs 4.5:1 (AA for normal-size text, applied to all text here); the focus outline, form
field borders and the chart lines are non-text contrast and need 3:1 (WCAG 1.4.11)
against every surface they appear on.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "client" / "console" / "static"
CSS = (STATIC / "console.css").read_text()
SCRIPT = (STATIC / "console.js").read_text()

TEXT_AA = 4.5
NON_TEXT_AA = 3.0


def luminance(colour: str) -> float:
    """WCAG relative luminance of ``#rgb`` or ``#rrggbb``."""
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(c * 2 for c in digits)
    assert re.fullmatch(r"[0-9a-fA-F]{6}", digits), colour
    channels = [int(digits[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(first: str, second: str) -> float:
    """WCAG contrast ratio of two colours, 1 to 21."""
    high, low = sorted((luminance(first), luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _rules(css: str) -> list[tuple[str, dict[str, str]]]:
    """(selector, declarations) of every rule, ``@media`` blocks' included."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        declarations = {}
        for declaration in body.split(";"):
            name, sep, value = declaration.partition(":")
            if sep:
                declarations[name.strip()] = value.strip()
        for selector in selectors.split(","):
            rules.append((" ".join(selector.split()), declarations))
    return rules


RULES = _rules(CSS)
VARIABLES = {
    name: value for selector, body in RULES if selector == ":root" for name, value in body.items()
}


def _colour(value: str | None) -> str | None:
    """A declaration's colour, ``var(--x)`` resolved; None when it names none (``inherit``,
    ``none``, a shorthand without a colour)."""
    if value is None:
        return None
    value = re.sub(r"var\((--[\w-]+)\)", lambda m: VARIABLES[m.group(1)], value)
    found = re.search(r"#[0-9a-fA-F]{3,6}\b", value)
    return found.group(0) if found else None


def _declared(selector: str, name: str) -> str | None:
    for candidate, body in RULES:
        if candidate == selector and name in body:
            return _colour(body[name])
    return None


def _must(colour: str | None, what: str) -> str:
    assert colour is not None, f"console.css no longer gives {what}"
    return colour


PAGE = _must(_colour("var(--bg)"), "--bg")
PANEL = _must(_colour("var(--panel)"), "--panel")
TEXT = _must(_colour("var(--fg)"), "--fg")
FOCUS = _must(_colour("var(--focus)"), "--focus")
HEADER = _must(_declared("header.top", "background"), "the header's background")
BUTTON_TEXT = _must(_declared("button", "color"), "the buttons' text colour")
FIELD_BORDER = _must(_declared("input", "border"), "the fields' border")


def _pairs() -> list[tuple[str, str, str]]:
    """(selector, text colour, background) for every text colour the stylesheet draws."""
    pairs = []
    for selector, body in RULES:
        if selector == ":root" or selector.startswith("@"):
            continue
        text = _colour(body.get("color"))
        background = _colour(body.get("background") or body.get("background-color"))
        if text is None and background is None:
            continue
        if text is None:
            text = BUTTON_TEXT if "button" in selector else TEXT
        if background is not None:
            surfaces = [background]
        elif selector.startswith("header.top"):
            surfaces = [HEADER]
        else:
            surfaces = [PAGE, PANEL]
        pairs += [(selector, text, surface) for surface in surfaces]
    return pairs


PAIRS = _pairs()


def test_the_palette_is_read_from_the_stylesheet() -> None:
    assert len(PAIRS) >= 30
    assert {"--fg", "--muted", "--accent", "--bad-fg", "--warn-fg", "--ok-fg"} <= set(VARIABLES)
    assert ("a", VARIABLES["--accent"], PAGE) in PAIRS
    assert ("header.top a", "#fff", HEADER) in PAIRS


@pytest.mark.parametrize(("selector", "text", "background"), PAIRS)
def test_text_meets_aa(selector: str, text: str, background: str) -> None:
    ratio = contrast(text, background)
    assert ratio >= TEXT_AA, f"{selector}: {text} on {background} is {ratio:.2f}:1"


def test_non_text_contrast_of_focus_fields_and_charts() -> None:
    surfaces = [PAGE, PANEL, HEADER] + [VARIABLES[n] for n in ("--ok-bg", "--bad-bg", "--warn-bg")]
    for surface in surfaces:
        ratio = contrast(FOCUS, surface)
        assert ratio >= NON_TEXT_AA, f"focus outline {FOCUS} on {surface}: {ratio:.2f}:1"
    for surface in (PAGE, PANEL):
        assert contrast(FIELD_BORDER, surface) >= NON_TEXT_AA, FIELD_BORDER
    colours = re.search(r"const colours = \[([^\]]+)\]", SCRIPT)
    assert colours, "console.js names its chart colours"
    lines = re.findall(r"#[0-9a-fA-F]{6}", colours.group(1))
    assert lines
    for line in lines:
        assert contrast(line, PAGE) >= NON_TEXT_AA, f"chart line {line}"


def test_the_ratio_itself() -> None:
    assert contrast("#000", "#fff") == pytest.approx(21)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert contrast("#fff", "#fff") == pytest.approx(1)
