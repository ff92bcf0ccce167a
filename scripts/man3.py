#!/usr/bin/env python3
"""Manual pages (section 3) for the C API, generated from shmlink.h's comments.

Every function of the header is declared after a block of `//` comment lines (cbindgen
copies the Rust doc comments there): the block becomes the page's DESCRIPTION, its
`# Safety` heading a subsection, `code` bold. shmlink.3 holds the header's opening
comment (the conventions: errors, errno values, thread safety) and lists every page.

    scripts/man3.py HEADER OUTDIR VERSION    writes OUTDIR/shmlink.3 and OUTDIR/FUNC.3
scripts/install.sh calls it (PREFIX/share/man/man3).
"""

import re
import sys
from pathlib import Path

FUNC = re.compile(r"\b(shmlink_[a-z0-9_]+)\s*\(")


def roff_text(line: str) -> str:
    """One line of prose as roff: backslashes escaped, `code` in bold."""
    line = line.replace("\\", "\\e")
    line = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", line)
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def body(comment: list[str]) -> list[str]:
    """The comment block as roff paragraphs; `# Heading` lines become subsections."""
    out = []
    for line in comment:
        if not line.strip():
            if out and out[-1] != ".PP":
                out.append(".PP")
        elif line.startswith("# "):
            out.append(".SS " + line[2:].strip())
        elif line.startswith("- "):
            out += [".IP \\(bu 2", roff_text(line[2:].strip())]
        else:
            out.append(roff_text(line.strip()))
    return out


def page(name: str, version: str, summary: str, synopsis: list[str], text: list[str]) -> str:
    head = [
        f'.TH {name.upper()} 3 "" "shmlink {version}" "shmlink C API"',
        ".SH NAME",
        f"{name} \\- {roff_text(summary)}",
        ".SH SYNOPSIS",
        ".nf",
        "\\fB#include <shmlink.h>\\fR",
        "",
        *[roff_text(s) for s in synopsis],
        ".fi",
        ".PP",
        "Link with \\fI$(pkg-config \\-\\-libs shmlink)\\fR.",
        ".SH DESCRIPTION",
    ]
    tail = [".SH SEE ALSO", "\\fBshmlink\\fR(3), \\fBshmlink\\fR(1)"]
    return "\n".join(head + text + tail) + "\n"


def summary_of(comment: list[str]) -> str:
    """The first sentence of the comment, for the NAME line."""
    text = " ".join(l.strip() for l in comment).strip()
    first = re.split(r"(?<=[.;:])\s", text, maxsplit=1)[0]
    first = first.rstrip(".;:")
    return first[:1].lower() + first[1:] if first else "shmlink C API call"


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    header, outdir, version = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    lines = header.read_text().splitlines()
    outdir.mkdir(parents=True, exist_ok=True)
    # The opening block comment: the conventions.
    intro = []
    if lines and lines[0].startswith("/*"):
        for line in lines[1:]:
            if line.strip().startswith("*/"):
                break
            intro.append(re.sub(r"^ \* ?", "", line))
    comment: list[str] = []
    names = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("//"):
            comment.append(line[3:] if line.startswith("// ") else line[2:])
            i += 1
            continue
        if comment and line.strip() and FUNC.search(line):
            decl = [line]
            while not decl[-1].rstrip().endswith(";") and i + 1 < len(lines):
                i += 1
                decl.append(lines[i])
            name = FUNC.search(line).group(1)
            text = page(name, version, summary_of(comment), decl, body(comment))
            (outdir / f"{name}.3").write_text(text)
            names.append(name)
        comment = [] if not line.startswith("//") else comment
        i += 1
    if not names:
        print(f"man3.py: no function found in {header}", file=sys.stderr)
        return 1
    listing = []
    for n in sorted(names):
        listing += [".TP", f"\\fB{n}\\fR(3)"]
    overview = page(
        "shmlink",
        version,
        "messaging between processes on one Linux kernel (the C library)",
        ["/* every call below; pkg-config --cflags --libs shmlink */"],
        body(intro) + [".SH FUNCTIONS"] + listing,
    )
    (outdir / "shmlink.3").write_text(overview)
    print(f"man3.py: {len(names) + 1} pages in {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
