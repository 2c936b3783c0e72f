#!/usr/bin/env bash
# Make the bundle that benchmarks/gpu_check.sh installs on a bare GPU machine (no network there): run it here, on a
# CPU machine with network and the project set up (`make setup`), then carry the bundle in the device call.
#     bash benchmarks/gpu_bundle.sh [DEST]          # default DEST: .gpu_bundle (git-ignored), in the repository root
# DEST then holds:
#   wheels/   the packages the GPU image lacks, for its CPython 3.12 on manylinux x86-64, at the versions of this
#             checkout's .venv (what the tests ran with): vizdoom, gymnasium, farama-notifications, tensorboardX,
#             and those it may lack (cloudpickle, psutil, tqdm, pytest-timeout, pytest-xdist, execnet);
#             with --no-deps (their other needs, numpy, cloudpickle, protobuf..., are in the image); not av (only
#             enjoy's videos need it)
#   cqueue/   the C++ queue sf.ipc._cqueue built by setup.py for CPython 3.12 (the image's python3 is 3.12; this
#             machine's .venv is another version): its glibc/libstdc++ needs are printed, and must not be newer
#             than the GPU image's (Ubuntu 24.04: glibc 2.39, GLIBCXX_3.4.33); gpu_check.sh rebuilds in place
#             there if this one does not load
#   doom_scenarios/   the Sample Factory Doom scenario data (data/doom_scenarios, pinned digests) without freedm.wad
#             (21 MB, doom_deathmatch_full alone needs it); gpu_check.sh copies it into data/doom_scenarios there
#   MANIFEST.txt      what is in it and how it was made
# The working tree plus the bundle must stay under the device call's 64 MiB: the size of both is printed and the
# script fails past 60 MiB. Python for pip: SF_BUNDLE_PYTHON (default .venv/bin/python); the target's version:
# SF_BUNDLE_PYTHON_VERSION (default 3.12, the GPU image's; another one makes a bundle for a bare venv of that version
# here, which is how the set-up from a bundle was tested without a GPU); that CPython, with its headers, for the build:
# SF_BUNDLE_BUILD_PYTHON (default: the first pythonX.Y that runs: on the PATH, then pyenv's, /usr/bin, /usr/local/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpu_bundle}
py=${SF_BUNDLE_PYTHON:-.venv/bin/python}
ver=${SF_BUNDLE_PYTHON_VERSION:-3.12}
is_ver() { [ "$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$ver" ]; }
pyb=${SF_BUNDLE_BUILD_PYTHON:-}
if [ -z "$pyb" ]; then  # the first that runs: a pyenv shim on the PATH may name a version not selected here
    for c in "python$ver" /root/.pyenv/versions/"$ver"*/bin/"python$ver" "/usr/bin/python$ver" \
             "/usr/local/bin/python$ver"; do
        if is_ver "$c"; then pyb=$c; break; fi
    done
fi
scenarios=${SF_DOOM_SCENARIOS:-data/doom_scenarios}
# what the image lacks, and what it may lack (each installed only where missing): the check's pytest plugins too
packages=(vizdoom gymnasium farama-notifications tensorboardX cloudpickle psutil tqdm pytest-timeout pytest-xdist
          execnet)
limit_mib=60  # of the device call's 64 MiB: room for files the tree gains before the call

die() { echo "gpu_bundle.sh: error: $*" >&2; exit 1; }
"$py" -c "import pip" 2>/dev/null || die "$py has no pip (set SF_BUNDLE_PYTHON to a Python with pip, or run make setup)"
[ -n "$pyb" ] && is_ver "$pyb" \
    || die "${pyb:-no python$ver that runs}: not CPython $ver (set SF_BUNDLE_BUILD_PYTHON): the C++ queue is" \
           "built for the target's Python (the GPU image's python3 is 3.12)"
[ -f "$scenarios/battle.wad" ] \
    || die "no Doom scenario data in $scenarios (fetch it: python -m sf_envs.doom.fetch_scenarios)"
command -v objdump >/dev/null \
    || die "objdump not found (apt-get install binutils): the C++ queue's glibc needs are checked with it"

[ ! -e "$dest" ] || [ -f "$dest/MANIFEST.txt" ] || [ -z "$(ls -A "$dest")" ] \
    || die "$dest exists and is not a bundle (no MANIFEST.txt): not replaced"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
new="$tmp/bundle"  # made here and moved into place at the end: a failure leaves DEST as it was
mkdir -p "$new/wheels" "$new/cqueue" "$new/doom_scenarios"

# 1. wheels: the .venv's versions, one of each (two versions of a package would stop the install there)
pins=()
for name in "${packages[@]}"; do
    v=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null) \
        || die "$name is not installed in $py (run make setup): its version is the one bundled"
    pins+=("$name==$v")
done
echo "wheels: downloading ${pins[*]} for CPython $ver, manylinux x86-64"
# pip matches each manylinux_2_N tag exactly: the usual ones are named (the device README's recipe)
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$ver" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$new/wheels" "${pins[@]}" || die "pip download of ${pins[*]} failed (network? see the lines above)"

# 2. the C++ queue for that CPython, by setup.py (its flags), built outside the tree: sf/ipc keeps this machine's build
if ! "$pyb" -c "import setuptools" 2>/dev/null; then
    # this Python has no setuptools: a setuptools wheel, unpacked, runs setup.py (pure Python, its needs vendored)
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp/st" setuptools \
        || die "pip download setuptools failed (needed to run setup.py with $pyb)"
    "$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/st/setuptools-*.whl \
        "$tmp/st/lib"
    export PYTHONPATH="$tmp/st/lib"
fi
echo "cqueue: building sf.ipc._cqueue with $pyb ($("$pyb" -V 2>&1))"
"$pyb" setup.py -q build_ext --build-lib "$tmp/lib" --build-temp "$tmp/build" >"$tmp/build.log" 2>&1 \
    || { tail -20 "$tmp/build.log" >&2; die "setup.py build_ext with $pyb failed (log above)"; }
so=$(find "$tmp/lib" -name '_cqueue*.so' 2>/dev/null | head -1 || true)
[ -n "$so" ] || die "setup.py build_ext made no _cqueue*.so"
cp "$so" "$new/cqueue/"
# the newest symbol versions it needs: the GPU image must have at least these
needs=$(objdump -T "$so" | grep -oE '(GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | sort -u -t_ -k1,1 -k2,2V \
        | awk -F_ '{v[$1]=$0} END {for (k in v) printf "%s%s", (n++ ? " " : ""), v[k]}')
echo "cqueue: $(basename "$so"), newest symbol versions needed: ${needs:-none}"
"$pyb" -c "
import importlib.util, sys
spec = importlib.util.spec_from_file_location('sf.ipc._cqueue', sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))" "$new/cqueue/$(basename "$so")" \
    || die "the $ver build of the C++ queue does not load here"

# 3. the Doom scenario data, without the one 21 MB map a single scenario uses
find "$scenarios" -maxdepth 1 -type f ! -name 'freedm.*' -exec cp {} "$new/doom_scenarios/" \;

{
    echo "gpu bundle for benchmarks/gpu_check.sh, made $(date -u +%Y-%m-%dT%H:%MZ)" \
         "at commit $(git rev-parse --short HEAD)"
    echo "wheels (gpu_check.sh installs those the Python lacks: pip install --no-index --no-deps): ${pins[*]}"
    echo "cqueue: $(basename "$so") built by setup.py with $("$pyb" -V 2>&1); needs ${needs:-nothing versioned}"
    echo "doom_scenarios: $(ls "$new/doom_scenarios" | wc -l) files from $scenarios" \
         "(freedm.* left out: doom_deathmatch_full only)"
} >"$new/MANIFEST.txt"

bundle=$(du -sb "$new" | cut -f1)
tree=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "bundle: $dest $((bundle / 1024 / 1024)) MiB (wheels $(du -sm "$new/wheels" | cut -f1) MiB); working tree" \
     "$((tree / 1024 / 1024)) MiB; together $(((bundle + tree) / 1024 / 1024)) MiB of the device call's 64 MiB"
[ $((bundle + tree)) -le $((limit_mib * 1024 * 1024)) ] \
    || die "tree + bundle exceed ${limit_mib} MiB: the device call carries at most 64 MiB"
rm -rf "$dest"
mv "$new" "$dest"
echo "done: carry $dest in the device call (run's carry: [\"$dest\"]); its command (docs/benchmarks.md, On a GPU):"
echo "    bash benchmarks/gpu_check.sh /tmp/gpu_check; rc=\$?;" \
     "cp /tmp/gpu_check/{summary.txt,logs.tar.gz} \$OUT/; exit \$rc"
