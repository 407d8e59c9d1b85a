#!/usr/bin/env python3
"""Writes Podman's default seccomp profile with bpf() allowed to CAP_BPF and perf_event_open()
to CAP_PERFMON, as containerd >= 1.7 and Docker >= 23 allow them: Podman before 4.4 (Debian
12's 4.3) allows both to CAP_SYS_ADMIN only, so the agent, which holds CAP_BPF and CAP_PERFMON
but not CAP_SYS_ADMIN, is refused. Usage:

    python3 bpf-seccomp.py [/usr/share/containers/seccomp.json] > phaseprof-seccomp.json
    podman run --security-opt seccomp=phaseprof-seccomp.json --cap-add=BPF,PERFMON,… phaseprof:0.1.0 …
"""
import json
import sys

GRANTS = {"bpf": "CAP_BPF", "perf_event_open": "CAP_PERFMON"}

source = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
with open(source) as f:
    profile = json.load(f)
for rule in profile["syscalls"]:
    # The rule refusing them to holders of neither capability would override the grants.
    if rule["action"] == "SCMP_ACT_ERRNO" and not rule.get("includes"):
        rule["names"] = [n for n in rule["names"] if n not in GRANTS]
profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]]
for name, cap in GRANTS.items():
    profile["syscalls"].append(
        {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [], "includes": {"caps": [cap]}}
    )
json.dump(profile, sys.stdout, indent=1)
