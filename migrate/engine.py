"""Convert one file's bytes: pre-filter, parse, detect the framework, run the rules in order.

(Being written for issue 3. Today: the pre-filter and the parse, and no rule yet.)
"""

from __future__ import annotations

import libcst

from .findings import Conversion, ConversionError, Options

_FRAMEWORK_WORDS = (b"torch", b"tensorflow", b"keras", b"paddle")


def convert(source: bytes, path: str, options: Options = Options()) -> Conversion:
    """Return the converted file. Raises ConversionError for a file that is not text or does not parse."""
    if not any(word in source for word in _FRAMEWORK_WORDS):
        return Conversion(path=path, original=source, output=source)
    try:
        module = libcst.parse_module(source)
    except libcst.ParserSyntaxError as exc:
        raise ConversionError(path, f"does not parse: {exc.message}", exc.raw_line, exc.raw_column + 1) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        raise ConversionError(path, f"is not text in its declared encoding: {exc}") from None
    return Conversion(path=path, original=source, output=module.bytes)
