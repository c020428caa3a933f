"""Untrusted text, made safe for where it is shown.

Every name the pack shows comes from the profiled application: NVTX ranges, kernels (C++ templates are
full of `<` and `>`), runtime APIs, processes, hosts and files. Reports get shared and opened in browsers,
so a name must never become markup. Each page, table, figure and printed line goes through one of
these functions for the context the name lands in; the HTML pages themselves are built only from the
pack's own templates.
"""

from __future__ import annotations

import html
import re

_MARKDOWN_SPECIAL = re.compile(r"[\x00-\x1f!-/:-@\[-`{-~\x7f]")  # ASCII controls and punctuation
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")  # characters XML 1.0 cannot hold at all


def html_text(value) -> str:
    """For HTML text and quoted attribute values."""
    return html.escape(str(value), quote=True)


def markdown_text(value) -> str:
    """For Markdown: ASCII punctuation and controls become numeric character references, which Markdown
    shows as the characters themselves (no emphasis, link, code span or raw HTML can start) and HTML
    decodes the same way, so the name reads exactly as it was recorded."""
    return _MARKDOWN_SPECIAL.sub(lambda m: f"&#{ord(m.group())};", str(value))


def markdown_code(value) -> str:
    """A name in code style inside Markdown. A Markdown code span cannot hold every string (backticks
    end it), so the name is escaped as text inside an HTML `code` element."""
    return f"<code>{markdown_text(value)}</code>"


def plotly_text(values):
    """For plotly labels, legend names, hover text and custom data (a str, or a pandas Series or Index).

    plotly.js reads a small subset of HTML in every text it draws (`<b>`, `<a href>`, `<br>`...) and
    decodes `&lt;`, `&gt;` and `&amp;`, so escaping those three shows `void k<float>` as written."""
    if hasattr(values, "str"):
        return (values.astype(str).str.replace("&", "&amp;", regex=False)
                .str.replace("<", "&lt;", regex=False).str.replace(">", "&gt;", regex=False))
    return html.escape(str(values), quote=False)


def terminal_text(value) -> str:
    """For lines printed to a terminal: control characters (escape sequences could rewrite the screen or
    the window title) are shown as `\\xNN`; tabs and newlines are kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def xml_text(value) -> str:
    """For an XML writer (which escapes markup itself): the characters XML 1.0 cannot hold, even escaped, shown as
    `\\xNN`, so that a name with a control character still makes a well-formed file."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
