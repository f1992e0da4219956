#!/usr/bin/env bash
# Writes the node agent image's tools into DIR, a root filesystem:
# iptables (nft and legacy), ipset and iproute2, unpacked from their Debian
# packages together with every package that provides a library one of their
# programs or iptables' extensions loads, as the host's loader resolves them.
# The packages come from the host's apt sources at the versions apt would
# install; the host must run the release the image is for (the same
# libraries), with the three tools installed. Maintainer scripts do not
# run, so the alternatives they would set up (iptables -> iptables-nft) are
# made here. scripts/build-images.sh and deploy/images/Containerfile use it.
#
#   scripts/agent-tools-root.sh DIR
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
tools_root="$1"
for tool in apt-get dpkg dpkg-deb ldd tar iptables ipset ip; do
  if ! command -v "$tool" >/dev/null; then
    echo "agent-tools-root: $tool is missing; the tools come from Debian packages installed here" >&2
    exit 1
  fi
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$tools_root"/usr/{bin,sbin,lib,lib64} "$tools_root"/{run,tmp,etc}
for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$tools_root/$dir"; done
chmod 1777 "$tools_root/tmp"
debs="$work/debs"
mkdir -p "$debs"
fetch() {
  (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$@" >/dev/null)
  for pkg in "$@"; do
    for deb in "$debs/${pkg}"_*.deb; do
      dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$tools_root"
    done
  done
}
roots=(iptables ipset iproute2)
# A fresh machine may have no package lists yet.
if ! fetch "${roots[@]}" 2>"$work/apt.err"; then
  apt-get update -q >/dev/null
  fetch "${roots[@]}"
fi
# The packages owning the libraries every unpacked ELF file needs.
owners() {
  find "$tools_root" -type f \( -perm -u+x -o -name '*.so*' \) -print0 \
    | xargs -0 ldd 2>/dev/null \
    | sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p' \
    | sort -u \
    | while read -r lib; do
        for path in "$lib" "${lib#/usr}" "/usr$lib" "$(readlink -f "$lib")"; do
          if owner="$(dpkg -S "$path" 2>/dev/null)"; then
            echo "${owner%%:*}"
            break
          fi
        done
      done | sort -u
}
# Unpacked libraries may load more (krb5's plugins load libssl): repeat
# until nothing new is needed.
have=("${roots[@]}")
for round in 1 2 3 4 5; do
  new=()
  for pkg in $(owners); do
    case " ${have[*]} " in *" $pkg "*) continue ;; esac
    new+=("$pkg")
  done
  [ ${#new[@]} -eq 0 ] && break
  if [ "$round" = 5 ]; then
    echo "agent-tools-root: the tools' libraries did not settle; still missing ${new[*]}" >&2
    exit 1
  fi
  echo "agent-tools-root: the agent's tools need ${new[*]}" >&2
  fetch "${new[@]}"
  have+=("${new[@]}")
done
for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sfn "${tool/tables/tables-nft}" "$tools_root/usr/sbin/$tool"
done
# Nothing reads documentation, translations or shell completions there.
rm -rf "$tools_root"/usr/share/{doc,man,info,lintian,bug,locale,bash-completion}
echo "agent-tools-root: $(du -sh "$tools_root" | cut -f1) in $tools_root" >&2
