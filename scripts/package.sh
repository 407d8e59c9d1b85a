#!/usr/bin/env bash
# Builds what deploy/ installs, from the release binaries (`cargo build --release --workspace`
# first), as root:
# - target/debian/phaseprof_VERSION-1_amd64.deb (cargo-deb): phaseprof and phaseprof-collector,
#   their man pages and shell completions, the systemd units (installed disabled) and default
#   configurations under /etc/phaseprof;
# - the OCI image localhost/phaseprof:VERSION (the name deploy/kubernetes uses), assembled by
#   buildah from these files and the shared libraries they load, nothing pulled, also saved as
#   target/release/package/phaseprof-VERSION.oci.tar (`ctr -n k8s.io images import` on a node,
#   or `podman load`).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(awk -F'"' '/^version = /{print $2; exit}' Cargo.toml)
bin=target/release
out=$bin/package
rm -rf "$out"
mkdir -p "$out/man" "$out/completions"

"$bin/phaseprof" man --dir "$out/man" 2>/dev/null
"$bin/phaseprof-collector" --man >"$out/man/phaseprof-collector.1"
"$bin/phaseprof" completions bash >"$out/completions/phaseprof.bash"
"$bin/phaseprof" completions zsh >"$out/completions/_phaseprof"
"$bin/phaseprof" completions fish >"$out/completions/phaseprof.fish"
cargo deb -p phaseprof --no-build --output "target/debian/phaseprof_${version}-1_amd64.deb" >/dev/null
echo "package: target/debian/phaseprof_${version}-1_amd64.deb"

# The image: both binaries, the libraries they load (as the loader resolves them here), a
# writable /tmp, the users the manifests run as. The agent runs as root with capabilities
# only; the collector as 10001.
ctr=$(buildah from scratch)
trap 'buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")
install -D -m 755 "$bin/phaseprof" "$root/usr/bin/phaseprof"
install -D -m 755 "$bin/phaseprof-collector" "$root/usr/bin/phaseprof-collector"
for lib in $(ldd "$bin/phaseprof" "$bin/phaseprof-collector" | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
  # (Their modes kept: the loader must stay executable.)
  mkdir -p "$root$(dirname "$lib")"
  cp -L --preserve=mode "$lib" "$root$lib"
done
mkdir -p "$root/tmp" "$root/etc/phaseprof" "$root/var/lib/phaseprof-agent"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nphaseprof:x:10001:10001:phaseprof:/:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nphaseprof:x:10001:\n' >"$root/etc/group"
install -m 644 deploy/etc/agent.toml "$root/etc/phaseprof/agent.toml"
buildah umount "$ctr" >/dev/null
revision=$("$bin/phaseprof" --version | sed -n 1p)
buildah config --entrypoint '["/usr/bin/phaseprof"]' --cmd '["--help"]' \
  --label "org.opencontainers.image.title=phaseprof" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.description=$revision" \
  --env PATH=/usr/bin "$ctr"
buildah commit --quiet --rm "$ctr" "localhost/phaseprof:$version" >/dev/null
trap - EXIT
rm -f "$out/phaseprof-$version.oci.tar"
buildah push --quiet "localhost/phaseprof:$version" "oci-archive:$out/phaseprof-$version.oci.tar:phaseprof:$version"
echo "image: localhost/phaseprof:$version ($out/phaseprof-$version.oci.tar)"
