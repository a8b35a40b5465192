"""What the Unicode table generators share (src/tokenizer/gen_unicode_tables.py,
src/chat/gen_unicode_tables.py): every code point but the surrogates, and
sorted code points folded into inclusive runs."""


def chars():
    """(code point, character) for every code point except the surrogates."""
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        yield cp, chr(cp)


def ranges(cps):
    """Sorted code points as [(first, last)] runs of consecutive values."""
    out, start, prev = [], None, None
    for cp in cps:
        if start is None:
            start = prev = cp
        elif cp == prev + 1:
            prev = cp
        else:
            out.append((start, prev))
            start = prev = cp
    if start is not None:
        out.append((start, prev))
    return out
