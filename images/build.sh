#!/usr/bin/env bash
# Builds the two stock images from a clean checkout: release binaries on the host, then
# `hpp-operator` and `hpp-csi-driver` from images/Containerfile.* with a context that holds only
# those binaries. Prints which base images it used, each image's size and the build time.
#
#   images/build.sh [--base auto|public|debian] [--registry REG] [--tag TAG] [--push] [--skip-cargo]
#
# --base public   the Containerfiles' defaults (gcr.io/distroless/cc-debian12, debian:bookworm-slim)
# --base debian   bases made here from the Debian package archive with mmdebstrap (no container
#                 registry needed): localhost/hpp-base/runtime (libc6, libgcc-s1: what distroless/cc
#                 holds) and localhost/hpp-base/tools (minbase with xfsprogs, util-linux, mount)
# --base auto     public when its images can be pulled, else debian (the default)
# --registry REG  image names are REG/hpp-operator and REG/hpp-csi-driver [ghcr.io/hpp-project]
# --tag TAG       [latest, as deploy/ refers to them]; the version tag vX.Y.Z is added too
# --push          push both tags of both images to REG (log in first: podman login REG)
# --skip-cargo    use the binaries already in target/<host triple>/image (cargo profile `image`:
#                 see Cargo.toml)
#
# The binaries are linked statically (glibc's crt-static): they run on any base image whatever
# its glibc, and map no shared libraries (about 2 MB of resident pages; docs/architecture.md).
# Name lookups (`files` and `dns` in nsswitch.conf) are built into static glibc.
#
# Environment: PODMAN (default: podman --runtime runc --cgroup-manager cgroupfs, which works on
# hosts where crun refuses hybrid cgroups), HPP_IMAGE_REGISTRY, HPP_IMAGE_TAG.
set -euo pipefail
cd "$(dirname "$0")/.."

base=auto
registry=${HPP_IMAGE_REGISTRY:-ghcr.io/hpp-project}
tag=${HPP_IMAGE_TAG:-latest}
push=false
cargo_build=true
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base=$2; shift 2 ;;
        --base=*) base=${1#*=}; shift ;;
        --registry) registry=$2; shift 2 ;;
        --registry=*) registry=${1#*=}; shift ;;
        --tag) tag=$2; shift 2 ;;
        --tag=*) tag=${1#*=}; shift ;;
        --push) push=true; shift ;;
        --skip-cargo) cargo_build=false; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "images/build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$base" in auto | public | debian) ;; *) echo "images/build.sh: --base must be auto, public or debian" >&2; exit 2 ;; esac

read -r -a podman <<<"${PODMAN:-podman --runtime runc --cgroup-manager cgroupfs}"
command -v "${podman[0]}" >/dev/null || { echo "images/build.sh: ${podman[0]} is not installed (apt-get install podman runc)" >&2; exit 1; }
# Explicit limits: runc refuses to raise them above what this process may have.
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=4096:4096")

started=$(date +%s)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
source_url=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n1)

# --target keeps the static flag off build scripts and proc macros (they load as shared objects).
host=$(rustc -vV | sed -n 's/^host: //p')
bins=${CARGO_TARGET_DIR:-target}/$host/image
# Static glibc, then two link options that keep the resident executable small (measured in
# docs/architecture.md, "Where the memory goes"):
# - RELR relocations (-z pack-relative-relocs): the start-up of a static PIE reads every relative
#   relocation, and 440 KB of .rela.dyn entries pack into 6 KB. Only with glibc 2.36 or later:
#   an older static glibc links them but does not apply them, and the executable crashes.
# - images/link-order.txt (lld's --symbol-ordering-file, made by `cargo xtask link-order`): the
#   functions the driver and operator run go first in .text, so the kernel maps those pages and
#   not the whole 5 MB around them. Given on x86_64 Linux, where Rust links with lld by default
#   (a build configured for another linker fails here: pass RUSTFLAGS with its own order option,
#   or none, and drop the list from this script); left out on other hosts. Cargo does not track
#   the file: after changing it, `touch hpp-bin/src/lib.rs`.
link_order=$PWD/images/link-order.txt
image_rustflags=(-Ctarget-feature=+crt-static)
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
if [ -n "$glibc" ] && printf '2.36\n%s\n' "$glibc" | sort -V -C; then
    image_rustflags+=(-Clink-arg=-Wl,-z,pack-relative-relocs)
else
    echo "   glibc ${glibc:-unknown} is older than 2.36: linking without RELR relocations"
fi
if [ "$host" = x86_64-unknown-linux-gnu ]; then
    # -Xlinker passes the path whole (-Wl, would split it at commas).
    image_rustflags+=(-Clink-arg=-Xlinker "-Clink-arg=--symbol-ordering-file=$link_order"
        -Clink-arg=-Wl,--no-warn-symbol-ordering)
else
    link_order=
fi
if $cargo_build; then
    echo "== release binaries (cargo build --profile image --target $host -p hpp-bin, static)"
    # Cargo reads CARGO_ENCODED_RUSTFLAGS before RUSTFLAGS: extend whichever is in force (as a
    # list, so a checkout path with spaces survives).
    if [ -n "${CARGO_ENCODED_RUSTFLAGS:-}" ]; then
        IFS=$'\x1f' read -r -a rustflags <<<"$CARGO_ENCODED_RUSTFLAGS"
    else
        read -r -a rustflags <<<"${RUSTFLAGS:-}"
    fi
    rustflags+=("${image_rustflags[@]}")
    CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f'; echo "${rustflags[*]}") HPP_BUILD_REVISION=$revision \
        cargo build --profile image --locked --target "$host" -p hpp-bin \
        --bin hpp-operator --bin hpp-mounter --bin hpp-csi-driver --bin hpp-provisioner
fi
for bin in hpp-operator hpp-mounter hpp-csi-driver hpp-provisioner; do
    [ -x "$bins/$bin" ] || { echo "images/build.sh: $bins/$bin is missing (build it, or drop --skip-cargo)" >&2; exit 1; }
    # A dynamic executable names its loader in a PT_INTERP header; the images want static ones.
    if command -v readelf >/dev/null && readelf -lW "$bins/$bin" | grep -q 'INTERP'; then
        echo "images/build.sh: $bins/$bin is dynamically linked (RUSTFLAGS overridden?)" >&2; exit 1
    fi
done
# The listed functions must sit at the front of .text: their mean rank among the functions by
# address (0 first, 1 last) was 0.13 with the list followed and 0.43 without it. A list whose
# names the build no longer has (a toolchain or dependency update renames Rust symbols) still
# passes that, so the share of names found is printed, with a warning when it is low (about
# half of the list is the driver's, four fifths the operator's).
if $cargo_build && [ -n "$link_order" ] && command -v nm >/dev/null; then
    for bin in hpp-csi-driver hpp-operator; do
        read -r listed names rank < <(nm -n --defined-only "$bins/$bin" | awk '
            NR == FNR { if ($0 !~ /^#/) { want[$0] = 1; names++ }; next }
            $2 ~ /^[tT]$/ { n++; if ($3 in want) { k++; sum += n } }
            END { printf "%d %d %.3f\n", k, names, k ? sum / k / n : 1 }' "$link_order" -)
        echo "   $bin: $listed of the $names functions in images/link-order.txt, mean rank in .text $rank"
        if awk -v r="$rank" 'BEGIN { exit !(r > 0.25) }'; then
            echo "images/build.sh: the linker did not follow images/link-order.txt in $bin" >&2; exit 1
        fi
        if [ $((listed * 10)) -lt $((names * 3)) ]; then
            echo "   warning: most of images/link-order.txt is not in $bin; remake it (cargo xtask link-order)"
        fi
    done
fi

ctx=target/images
rm -rf "$ctx/operator" "$ctx/csi-driver"
mkdir -p "$ctx/operator/bin" "$ctx/csi-driver/bin"
cp "$bins/hpp-operator" "$bins/hpp-mounter" "$ctx/operator/bin/"
cp "$bins/hpp-csi-driver" "$bins/hpp-provisioner" "$ctx/csi-driver/bin/"
# The image profile (like release) keeps line tables for backtraces on the host; the images ship stripped
# binaries (about a tenth of the size).
if command -v strip >/dev/null; then
    strip "$ctx"/operator/bin/* "$ctx"/csi-driver/bin/*
else
    echo "   warning: strip (binutils) is not installed: the images carry debug line tables"
fi

# Default bases: the ARG defaults of the Containerfiles.
arg_default() { sed -n "s/^ARG $1=//p" "images/Containerfile.$2" | head -n1; }
public_runtime=$(arg_default RUNTIME_BASE operator)
public_tools=$(arg_default TOOLS_BASE operator)
local_runtime=localhost/hpp-base/runtime:bookworm
local_tools=localhost/hpp-base/tools:bookworm

pull_public() {
    timeout 60 "${podman[@]}" pull -q "$public_runtime" >/dev/null 2>&1 &&
        timeout 60 "${podman[@]}" pull -q "$public_tools" >/dev/null 2>&1
}

# A base from the Debian archive: mmdebstrap into a tarball, podman import. Kept between runs.
debian_base() {
    local name=$1 variant=$2 include=$3
    if "${podman[@]}" image exists "$name"; then
        echo "   $name exists (podman rmi $name to rebuild it)"
        return
    fi
    command -v mmdebstrap >/dev/null || { echo "images/build.sh: mmdebstrap is not installed (apt-get install mmdebstrap)" >&2; exit 1; }
    local tar="$ctx/$(basename "${name%%:*}").tar"
    mmdebstrap --quiet --variant="$variant" --include="$include" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        bookworm "$tar"
    "${podman[@]}" import -q "$tar" "$name" >/dev/null
    rm -f "$tar"
    echo "   made $name with mmdebstrap --variant=$variant --include=$include"
}

if [ "$base" = auto ]; then
    echo "== checking whether the public base images can be pulled"
    if pull_public; then base=public; else base=debian; echo "   they cannot: using Debian bases made with mmdebstrap"; fi
elif [ "$base" = public ]; then
    pull_public || { echo "images/build.sh: cannot pull $public_runtime / $public_tools (try --base debian)" >&2; exit 1; }
fi
if [ "$base" = debian ]; then
    echo "== Debian base images (mmdebstrap)"
    debian_base "$local_runtime" extract libc6,libgcc-s1,base-files
    debian_base "$local_tools" minbase xfsprogs,util-linux,mount,e2fsprogs
    runtime_base=$local_runtime tools_base=$local_tools
else
    runtime_base=$public_runtime tools_base=$public_tools
fi
echo "== base images ($base): runtime $runtime_base, tools $tools_base"

images=()
for name in operator csi-driver; do
    image="$registry/hpp-$name"
    echo "== $image:$tag"
    "${podman[@]}" build -q --network host "${ulimits[@]}" \
        --build-arg "RUNTIME_BASE=$runtime_base" --build-arg "TOOLS_BASE=$tools_base" \
        --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url" \
        -f "images/Containerfile.$name" -t "$image:$tag" -t "$image:v$version" "$ctx/$name" >/dev/null
    images+=("$image")
done

echo "== images"
for image in "${images[@]}"; do
    size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image:$tag")
    awk -v i="$image:$tag" -v s="$size" 'BEGIN { printf "   %-45s %6.1f MB\n", i, s / 1e6 }'
done
if $push; then
    for image in "${images[@]}"; do
        "${podman[@]}" push "$image:$tag"
        "${podman[@]}" push "$image:v$version"
    done
fi
echo "== done in $(($(date +%s) - started)) s (bases: $base)"
