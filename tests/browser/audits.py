"""Measurements a person would notice, taken inside the rendered page: overflow, text size, contrast, labels.

Guarantee: each audit reads what Chromium actually laid out and painted (computed styles, boxes),
not the HTML source, and returns the offending elements (empty when the page passes).
"""

from __future__ import annotations

from typing import cast

from playwright.sync_api import Locator, Page

# Elements that show text of their own (a direct, non-blank text node) and are rendered.
_TEXT_ELEMENTS = """
() => [...document.querySelectorAll('body *')].filter((el) => {
  const shown = el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  return shown && [...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
})
"""

_CONTRAST = (
    """
() => {
  const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const over = (top, bottom) => {
    const a = top.length > 3 ? top[3] : 1;
    return [0, 1, 2].map((i) => top[i] * a + bottom[i] * (1 - a));
  };
  const background = (el) => {
    const layers = [];
    for (let node = el; node; node = node.parentElement) {
      const c = parse(getComputedStyle(node).backgroundColor);
      if (c.length && (c.length < 4 || c[3] > 0)) { layers.push(c); if (c.length < 4 || c[3] === 1) break; }
    }
    return layers.reduceRight((below, layer) => over(layer, below), [255, 255, 255]);
  };
  const failures = [];
  for (const el of ("""
    + _TEXT_ELEMENTS
    + """)()) {
    const style = getComputedStyle(el);
    const bg = background(el);
    const fg = over(parse(style.color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    const text = el.textContent.trim().slice(0, 40);
    if (ratio < (large ? 3 : 4.5)) failures.push(`${el.tagName} ${ratio.toFixed(2)}: ${text}`);
  }
  return failures;
}
"""
)

_SMALL_TEXT = (
    "(minimum) => (" + _TEXT_ELEMENTS + ")().filter((el) => parseFloat(getComputedStyle(el).fontSize) < minimum)"
    ".map((el) => `${el.tagName} ${getComputedStyle(el).fontSize}: ${el.textContent.trim().slice(0, 40)}`)"
)

_UNLABELLED = """
() => [...document.querySelectorAll('input:not([type=hidden]), textarea, select, button')]
  .filter((el) => {
    const named = el.labels?.length || el.getAttribute('aria-label') || el.getAttribute('aria-labelledby');
    return !named && !(el.tagName === 'BUTTON' && el.textContent.trim());
  })
  .map((el) => el.outerHTML.slice(0, 80))
"""


def horizontal_overflow(page: Page) -> int:
    """How many CSS pixels the page is wider than the device's screen (0 when nothing scrolls sideways).

    Measured against the configured viewport, not `innerWidth`: a phone lays out a page without a
    viewport meta tag 980 px wide and shrinks it, which is exactly the illegibility this catches.
    """
    assert page.viewport_size is not None
    width = page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)")
    return max(0, int(width) - page.viewport_size["width"])


def low_contrast_text(page: Page) -> list[str]:
    """Text below WCAG 2 AA contrast against its painted background (4.5:1, or 3:1 for large text)."""
    return cast(list[str], page.evaluate(_CONTRAST))


def text_smaller_than(page: Page, pixels: float) -> list[str]:
    return cast(list[str], page.evaluate(_SMALL_TEXT, pixels))


def unlabelled_controls(page: Page) -> list[str]:
    return cast(list[str], page.evaluate(_UNLABELLED))


def bottom_of(locator: Locator) -> float:
    """Where `locator` ends, in CSS pixels from the top of the page (it must be rendered)."""
    box = locator.bounding_box()
    assert box is not None, f"{locator} is not rendered"
    return box["y"] + box["height"]
