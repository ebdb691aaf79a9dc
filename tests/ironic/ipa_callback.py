"""Posts introspection data to an inspector's callback with ironic-python-agent's own client code.

    ipa_callback.py DATA.json --inspection_callback_url http://HOST:5050/v1/continue

ironic-python-agent (from PyPI, pinned in constraints.txt) is configured as the ramdisk is, from its own command
line options, and `ironic_python_agent.inspector.call_inspector` posts the data exactly as it does at the end of
inspection (headers, encoding, retries on 409 and 5xx). The JSON reply is printed; an error reply exits 1 with
IPA's own error message. A truthy "error" in DATA becomes one of IPA's accumulated failures, as a collector that
failed would add it (IPA then sends its failures as "error").
"""
import json
import sys

from oslo_config import cfg

from ironic_python_agent import config as ipa_config
from ironic_python_agent import errors, inspector, utils


def main():
    path, args = sys.argv[1], sys.argv[2:]
    ipa_config.populate_config()
    cfg.CONF(args=args, project="ironic-python-agent")
    with open(path) as f:
        data = json.load(f)
    failures = utils.AccumulatedFailures(exc_class=errors.InspectionError)
    if data.get("error"):
        failures.add(data.pop("error"))
    try:
        reply = inspector.call_inspector(data, failures)
    except errors.InspectionError as e:
        print(f"IPA: {e}", file=sys.stderr)
        return 1
    print(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
