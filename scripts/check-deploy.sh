#!/usr/bin/env bash
# Scores deploy/kubernetes with kube-score (installed with `go install`, pinned): every
# combination that is applied together (the agent, one of the two collectors, the network
# policies) must pass with no warning. The systemd units' limits are checked by the tests
# (tests/integration/deploy.rs).
set -euo pipefail
cd "$(dirname "$0")/../deploy/kubernetes"
version=v1.20.0
bin="$(go env GOPATH)/bin/kube-score"
if ! "$bin" version 2>/dev/null | grep -q "${version#v}"; then
  GOFLAGS=-mod=mod go install "github.com/zegl/kube-score/cmd/kube-score@$version"
fi
for collector in collector.yaml collector-clickhouse.yaml; do
  echo "kube-score: agent-daemonset.yaml $collector network-policy.yaml"
  # The seccomp check is optional in kube-score: on here.
  "$bin" score --exit-one-on-warning --enable-optional-test container-seccomp-profile \
    agent-daemonset.yaml "$collector" network-policy.yaml
done
echo "kube-score: deploy/kubernetes passes"
