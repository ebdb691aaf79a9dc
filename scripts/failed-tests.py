#!/usr/bin/env python3
"""Prints, for each failed test of the JUnit reports named, its name and why it failed (the panic's message).

scripts/test.sh runs it at the end of a failed run, just above the stage table: a failed test prints its whole
output (an HA site's test, the logs of a dozen daemons) and its reason ends up far above the end of the run, where
whoever reads only the end of CI's log never sees it. Reports that do not exist are skipped.
"""
import sys
import xml.etree.ElementTree as ET

MAX_LINES = 8
MAX_CHARS = 400


def reason(text):
    """The panic's lines (from "panicked at" to the backtrace or a blank line), or the output's last lines."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "panicked at" in line:
            out = [line.strip()]
            for more in lines[i + 1:]:
                if not more.strip() or more.strip().startswith(("stack backtrace:", "note: run with")):
                    break
                out.append(more.strip())
                if len(out) >= MAX_LINES:
                    break
            return out
    return [x.strip() for x in lines if x.strip()][-3:]


def main(paths):
    failed = []
    for path in paths:
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            continue
        for case in tree.iter("testcase"):
            for kid in case:
                if kid.tag in ("failure", "error"):
                    why = reason(kid.text or "") or [kid.get("message", "")]
                    failed.append((case.get("classname", ""), case.get("name", ""), kid.get("type", ""), why))
    if not failed:
        return
    print(f"\n{len(failed)} failed test(s) (their whole output is above):")
    for classname, name, kind, why in failed:
        print(f"- {classname} {name} ({kind})")
        for line in why:
            print(f"    {line[:MAX_CHARS]}")


if __name__ == "__main__":
    main(sys.argv[1:])
