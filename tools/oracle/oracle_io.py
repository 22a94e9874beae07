"""What the oracle scripts share for writing fixtures: a file's sha256 (manifests pin the checkpoints and fixtures
they were made from), JSON in the compact form the server writes, and the JSON-lines and manifest files."""
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


def write_jsonl(path, rows):
    """One JSON value per line, non-ASCII text kept."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_manifest(path, manifest, **dump_args):
    """`manifest` as indented JSON and a final newline (`dump_args`: more json.dump arguments)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, **dump_args)
        f.write("\n")
