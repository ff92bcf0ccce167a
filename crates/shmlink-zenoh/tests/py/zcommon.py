"""What zpub.py and zsub.py share: the message checksum and the Zenoh session
configuration (peer mode, the one endpoint, no scouting)."""
import json

import zenoh


def fnv(b):
    """FNV-1a 64 of `b` (the shmlink tests' checksum)."""
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def peer_config(endpoint):
    """A peer that connects to `endpoint` and to nothing it would scout."""
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("connect/endpoints", json.dumps([endpoint]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    return conf
