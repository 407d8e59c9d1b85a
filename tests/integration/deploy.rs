//! The deployment files keep the limits the threat model (README) counts on: kube-score checks
//! the Kubernetes manifests as a whole (scripts/check-deploy.sh, run by the test command); this
//! checks the fields themselves, in the manifests and in the systemd units, so that a change
//! that drops one fails here by name.
use phaseprof_e2e::root;

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// Checks every container of the manifests: no privilege escalation, the runtime's seccomp
// profile, memory limits, the read-only root; the agent reaches the collector over https and
// the collectors serve it.
#[test]
fn manifests_keep_their_limits() {
    for (file, containers) in [
        ("deploy/kubernetes/agent-daemonset.yaml", 1),
        ("deploy/kubernetes/collector.yaml", 1),
        ("deploy/kubernetes/collector-clickhouse.yaml", 1),
    ] {
        let m = read(file);
        for field in [
            "allowPrivilegeEscalation: false",
            "seccompProfile: {type: RuntimeDefault}",
            "readOnlyRootFilesystem: true",
            "automountServiceAccountToken: false",
            "drop: [\"ALL\"]",
        ] {
            assert!(
                m.matches(field).count() >= containers,
                "{file}: missing `{field}`"
            );
        }
        assert!(
            m.contains("limits: {cpu:") && m.contains("memory:"),
            "{file}: no resource limits"
        );
        assert!(!m.contains("privileged: true"), "{file}");
    }
    let agent = read("deploy/kubernetes/agent-daemonset.yaml");
    assert!(
        agent.contains("collector = \"https://"),
        "agents push over https"
    );
    assert!(agent.contains("ca_file = "));
    for file in [
        "deploy/kubernetes/collector.yaml",
        "deploy/kubernetes/collector-clickhouse.yaml",
    ] {
        let m = read(file);
        assert!(
            m.contains("--tls-cert") && m.contains("--tls-key"),
            "{file}: serves https"
        );
        assert!(m.contains("runAsNonRoot: true"), "{file}");
    }
    let np = read("deploy/kubernetes/network-policy.yaml");
    assert!(np.contains("app: phaseprof-collector") && np.contains("app: phaseprof-agent"));
}

// Checks the systemd units: the collector's memory, open files and tasks are bounded, it
// filters system calls, reads the tokens as a credential and by default (the package's
// options) serves this host only; the agent's memory is bounded and it cannot gain privileges.
#[test]
fn systemd_units_keep_their_limits() {
    let c = read("deploy/systemd/phaseprof-collector.service");
    for field in [
        "MemoryMax=",
        "LimitNOFILE=",
        "TasksMax=",
        "NoNewPrivileges=yes",
        "SystemCallFilter=@system-service",
        "CapabilityBoundingSet=\n",
        "LoadCredential=agent-tokens:",
        "ExecStart=/usr/bin/phaseprof-collector",
    ] {
        assert!(
            c.contains(field),
            "collector unit: missing `{}`",
            field.trim()
        );
    }
    let env = read("deploy/etc/collector.env");
    assert!(
        env.contains("\nPHASEPROF_COLLECTOR_ARGS=\"--listen 127.0.0.1:"),
        "{env}"
    );
    let a = read("deploy/systemd/phaseprof-agent.service");
    for field in [
        "MemoryMax=",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=CAP_BPF",
    ] {
        assert!(a.contains(field), "agent unit: missing `{field}`");
    }
}
