#!/usr/bin/env python3
"""Fails when a documented public function's comment does not name one of its parameters.

Run by the cadence_docs target on Doxygen's XML output (cmake/CadenceDocs.cmake). Doxygen's own
WARN_NO_PARAMDOC would demand a \\param and a \\return for every function; the house style is
one sentence that names the parameters ("Worker p finished an iteration at time t"), so this
checks exactly that: every named parameter of every public function in the reference appears
as a word in its comment (the prose or a \\param line). Exempt: operators, and the source of a
copy or move (its meaning is fixed by the language). Undocumented functions are Doxygen's
warning already.

usage: check_params.py XML_DIR
"""
import os
import re
import sys
import xml.etree.ElementTree as ET


def text(element):
    return "" if element is None else "".join(element.itertext())


def bare_type(type_text):
    """'const any_controller &' -> 'any_controller'; template arguments dropped."""
    t = re.sub(r"<.*>", "", type_text)
    t = re.sub(r"\b(const|volatile)\b|[&*]", "", t)
    return t.strip().rsplit("::", 1)[-1]


def main(xml_dir):
    seen = set()
    problems = []
    checked = 0
    for name in sorted(os.listdir(xml_dir)):
        if not name.endswith(".xml") or name == "index.xml":
            continue
        for compound in ET.parse(os.path.join(xml_dir, name)).getroot().iter("compounddef"):
            # Private nested classes are in the XML too; they are not the public API.
            if compound.get("prot") not in (None, "public"):
                continue
            owner = text(compound.find("compoundname")).rsplit("::", 1)[-1]
            for member in compound.iter("memberdef"):
                if member.get("kind") != "function" or member.get("prot") != "public":
                    continue
                if member.get("id") in seen:
                    continue
                seen.add(member.get("id"))
                doc = text(member.find("briefdescription")) + " " + text(
                    member.find("detaileddescription"))
                function = member.findtext("name")
                if not doc.strip() or function.startswith("operator"):
                    continue
                checked += 1
                params = member.findall("param")
                for param in params:
                    declared = param.findtext("declname")
                    if not declared:
                        continue
                    if len(params) == 1 and bare_type(text(param.find("type"))) == owner:
                        continue  # the source of a copy or move
                    if re.search(r"(?<![\w.])" + re.escape(declared) + r"(?!\w)", doc):
                        continue
                    where = member.find("location")
                    problems.append("%s:%s: %s: the comment does not name parameter '%s'"
                                    % (where.get("file"), where.get("line"),
                                       member.findtext("qualifiedname"), declared))
    for line in problems:
        print(line)
    print("check_params: %d documented public functions, %d unnamed parameters"
          % (checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
