#!/usr/bin/env python3
"""Build kvgraph's training corpus from the Debian `fortunes` data files.

Reads the plain-text fortune files installed by the Debian packages
`fortunes` and `fortunes-min` (default /usr/share/games/fortunes), cleans each
entry, removes duplicates, and writes a deterministic train / validation /
held-out split:

    data/corpus/fortunes.txt   training entries            (~92 %)
    data/corpus/valid.txt      validation entries          (~4 %, early stopping)
    data/corpus/heldout.txt    held-out test entries       (~4 %, reported perplexity)
    data/corpus/manifest.json  sources, counts, checksums

File format (all three .txt files): UTF-8, LF line endings, every entry is
followed by a line containing only "%" -- the classic fortune(6) format, so
`strfile` and kvgraph's tools can parse it the same way. An entry never
contains a line that is exactly "%".

Which split an entry lands in depends only on the SHA-256 of its cleaned text,
so the split is stable across machines and does not shift when entries are
added or removed. Entry order inside each file is: source file name (sorted),
then position in that file.

Only the Python standard library is used.

Usage:
    python3 tools/prepare_corpus.py [--src /usr/share/games/fortunes] [--out data/corpus]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

SEPARATOR_LINE = "%"

# Files that are pictures rather than prose; the language model has nothing to
# learn from them.
EXCLUDED_FILES = {"ascii-art"}

HELDOUT_PERCENT = 4  # sha256 bucket 0..3   -> heldout.txt
VALID_PERCENT = 4    # sha256 bucket 4..7   -> valid.txt

# Entries shorter than this (in characters after cleaning) are dropped.
MIN_ENTRY_CHARS = 8
# Entries whose share of letters among non-space characters is below this are
# dropped (ASCII drawings that are mixed into the prose files).
MIN_LETTER_RATIO = 0.55

_MOJIBAKE = re.compile("[\u00c2-\u00f4][\u0080-\u00bf]+")


def _fix_mojibake(text: str) -> str:
    """Repair UTF-8 text that was decoded as Latin-1 once (e.g. 'â\\x80\\x99')."""

    def repl(m: re.Match) -> str:
        s = m.group(0)
        try:
            return s.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return s

    for _ in range(3):  # some entries were mis-decoded twice
        fixed = _MOJIBAKE.sub(repl, text)
        if fixed == text:
            break
        text = fixed
    return text


def _overstrike_line(line: str) -> str:
    """Resolve backspace overstriking like `col -b` (underline / bold)."""
    if "\b" not in line:
        return line
    buf: list[str] = []
    pos = 0
    for ch in line:
        if ch == "\b":
            pos = max(0, pos - 1)
            continue
        if pos < len(buf):
            old = buf[pos]
            # "_\bX" and "X\b_" are underlined X; "X\bX" is bold X.
            if not (ch == "_" and old not in (" ", "_")):
                buf[pos] = ch
        else:
            buf.append(ch)
        pos += 1
    return "".join(buf)


def clean_entry(raw: str) -> str:
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    text = _fix_mojibake(text)
    lines = []
    for line in text.split("\n"):
        line = _overstrike_line(line)
        # Drop remaining control characters (bell, escape, ...); keep tab.
        line = "".join(c for c in line if c == "\t" or (ord(c) >= 32 and ord(c) != 127))
        lines.append(line.rstrip())
    # Trim leading / trailing blank lines and collapse runs of blank lines.
    out: list[str] = []
    for line in lines:
        if line == "" and (not out or out[-1] == ""):
            continue
        out.append(line)
    while out and out[-1] == "":
        out.pop()
    # A line that is exactly "%" would break the file format.
    out = [" %" if l == SEPARATOR_LINE else l for l in out]
    return "\n".join(out)


def letter_ratio(text: str) -> float:
    visible = [c for c in text if not c.isspace()]
    if not visible:
        return 0.0
    return sum(c.isalpha() for c in visible) / len(visible)


def split_entries(text: str) -> list[str]:
    entries, cur = [], []
    for line in text.split("\n"):
        if line.rstrip("\r") == SEPARATOR_LINE:
            entries.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    entries.append("\n".join(cur))
    return entries


def source_files(src: str) -> list[str]:
    names = []
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name.endswith((".dat", ".u8")) or name.startswith("."):
            continue
        if name in EXCLUDED_FILES:
            continue
        if os.path.islink(path) or not os.path.isfile(path):
            continue  # skips the off/ (offensive) directory and *.u8 links
        names.append(name)
    return names


def bucket(entry: str) -> int:
    return int.from_bytes(hashlib.sha256(entry.encode("utf-8")).digest()[:8], "big") % 100


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in ("fortunes", "fortunes-min"):
        try:
            v = subprocess.run(
                ["dpkg-query", "-W", "-f=${Version}", pkg],
                capture_output=True, text=True, check=False,
            ).stdout.strip()
        except OSError:
            v = ""
        out[pkg] = v or "unknown"
    return out


def write_entries(path: str, entries: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for e in entries:
            f.write(e)
            f.write("\n" + SEPARATOR_LINE + "\n")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="/usr/share/games/fortunes")
    ap.add_argument("--out", default="data/corpus")
    args = ap.parse_args()

    if not os.path.isdir(args.src):
        print(f"error: {args.src} not found (apt-get install fortunes fortunes-min)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)

    seen: set[str] = set()
    splits: dict[str, list[str]] = {"train": [], "valid": [], "heldout": []}
    per_file: dict[str, int] = {}
    dropped = {"short": 0, "not_prose": 0, "duplicate": 0}
    for name in source_files(args.src):
        with open(os.path.join(args.src, name), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        kept = 0
        for raw in split_entries(text):
            e = clean_entry(raw)
            if len(e) < MIN_ENTRY_CHARS:
                dropped["short"] += 1
                continue
            if letter_ratio(e) < MIN_LETTER_RATIO:
                dropped["not_prose"] += 1
                continue
            if e in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(e)
            kept += 1
            b = bucket(e)
            if b < HELDOUT_PERCENT:
                splits["heldout"].append(e)
            elif b < HELDOUT_PERCENT + VALID_PERCENT:
                splits["valid"].append(e)
            else:
                splits["train"].append(e)
        per_file[name] = kept

    files = {"train": "fortunes.txt", "valid": "valid.txt", "heldout": "heldout.txt"}
    manifest = {
        "source_dir": args.src,
        "debian_packages": package_versions(),
        "license": "BSD (see /usr/share/doc/fortunes/copyright)",
        "excluded_files": sorted(EXCLUDED_FILES),
        "format": "UTF-8; each entry is followed by a line containing only '%'",
        "split_rule": (
            f"bucket = int(sha256(entry_utf8)[:8], big-endian) % 100; "
            f"bucket < {HELDOUT_PERCENT} -> heldout, "
            f"< {HELDOUT_PERCENT + VALID_PERCENT} -> valid, else train"
        ),
        "entries_per_source_file": per_file,
        "dropped": dropped,
        "splits": {},
    }
    for split, fname in files.items():
        path = os.path.join(args.out, fname)
        write_entries(path, splits[split])
        manifest["splits"][split] = {
            "file": fname,
            "entries": len(splits[split]),
            "bytes": os.path.getsize(path),
            "sha256": sha256_file(path),
        }
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")

    for split, info in manifest["splits"].items():
        print(f"{split:8s} {info['entries']:6d} entries {info['bytes']:9d} bytes -> {info['file']}")
    print(f"dropped: {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
