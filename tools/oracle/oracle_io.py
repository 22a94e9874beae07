"""What the oracle scripts share for writing fixtures: a file's sha256 (manifests pin the checkpoints and fixtures
they were made from) and JSON in the compact form the server writes."""
import hashlib
import json


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
