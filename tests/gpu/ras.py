"""NCCL RAS during the GPU check's hang (issue 34, docs/ras.md): asks the job's RAS service
itself, in NCCL 2.30.7's protocol (src/ras/client.cc), and reads what the agent's
diagnose --hang made of it. Recorded, not judged: the service exists only in NCCL >= 2.24
(JSON from 2.28.7), so "absent" is an answer too; the checks only ask that the agent agrees
with what the script saw.
"""
import json
import socket


def query(addr=("127.0.0.1", 28028), timeout=3.0):
    """{"state": answered | no_json | absent, ...} as the agent's sources::ras would say."""
    try:
        s = socket.create_connection(addr, timeout=timeout)
    except OSError as e:
        return {"state": "absent", "detail": str(e)}
    f = s.makefile("rwb")
    try:
        def say(line):
            f.write(line.encode() + b"\n")
            f.flush()
            return f.readline().decode().strip()

        server = say("CLIENT PROTOCOL 2")
        if not server.upper().startswith("SERVER PROTOCOL "):
            return {"state": "absent", "detail": f"not RAS: {server!r}"}
        say("TIMEOUT 2")
        if say("SET FORMAT json").upper() != "OK":
            return {"state": "no_json", "detail": server}
        s.settimeout(timeout + 2)
        f.write(b"STATUS\n")
        f.flush()
        body = f.read(8 << 20).decode()
        rep = json.loads(body)
        comms = rep.get("communicators", [])
        return {"state": "answered", "detail": server, "nccl_version": rep.get("nccl_version"), "communicators": len(comms),
                "missing": [m for c in comms for m in c.get("missing_ranks", [])],
                "counts": [{r["rank"]: r.get("collective_counts", {}) for r in c.get("ranks", [])} for c in comms]}
    except (OSError, ValueError) as e:
        return {"state": "absent", "detail": f"{type(e).__name__}: {e}"}
    finally:
        s.close()


def checks(seen, hang_json):
    """seen: query() during the hang; hang_json: the agent's diagnose --hang JSON (dict)."""
    notes = hang_json.get("notes", []) if isinstance(hang_json, dict) else []
    agent_ras = hang_json.get("ras", []) if isinstance(hang_json, dict) else []
    if seen["state"] == "absent":
        ok = any("NCCL RAS: absent" in n for n in notes)
    else:
        ok = any(v.get("state") == seen["state"] for v in agent_ras)
    return {"agent_ras_state_matches_the_scripts_query": ok}
