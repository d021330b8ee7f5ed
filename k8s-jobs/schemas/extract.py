#!/usr/bin/env python3
"""Writes a CRD's published OpenAPI schema (its storage version's openAPIV3Schema) as the
JSON that lab/validate-manifests checks rendered objects against, descriptions removed:

    extract.py CRD.yaml > GROUP_VERSION_KIND.json

README.md names the release and commit each schema here was taken from."""
import json
import sys

import yaml


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


crd = yaml.safe_load(open(sys.argv[1]))
version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
schema = strip(version["schema"]["openAPIV3Schema"])
schema["x-rdmabench-source"] = {
    "group": crd["spec"]["group"],
    "version": version["name"],
    "kind": crd["spec"]["names"]["kind"],
}
json.dump(schema, sys.stdout, separators=(",", ":"), sort_keys=True)
print()
