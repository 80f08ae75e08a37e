#!/usr/bin/env bash
# Build the Debian package of distkernel and print its path on the last line.
#
#   scripts/package.sh             -> build-deb/debs/distkernel_VERSION_ARCH.deb
#   BUILD=DIR scripts/package.sh   another build dir
#
# The package is debian/'s (debhelper, meson, dh_python3): this script runs
# `debian/rules binary` as dpkg-buildpackage -b would, minus what only an
# upload needs (.changes, .buildinfo, signing, the source package), and with
# two differences that keep it quick enough for a CI stage:
#   - the meson build dir (BUILD, default build-deb) is kept between runs, so
#     a second run only rebuilds what changed; dpkg-buildpackage would start
#     with `debian/rules clean`, which deletes it;
#   - DEB_BUILD_OPTIONS is "nocheck noautodbgsym parallel=NPROC" unless the
#     caller sets it: no unit tests (they are test.sh's own stage, and the
#     build dir then builds none), no -dbgsym package, every core.
# The .deb goes to BUILD/debs rather than to `..`, and lintian must report no
# errors on it (its warnings and notes are printed).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-deb}
export DEB_BUILD_OPTIONS=${DEB_BUILD_OPTIONS-nocheck noautodbgsym parallel=$(nproc)}

# The package's version is debian/changelog's; it must be meson's.
version=$(dpkg-parsechangelog -S Version)
meson_version=$(sed -n "s/^ *version: *'\([^']*\)'.*/\1/p" meson.build | head -n1)
if [ "$version" != "$meson_version" ]; then
  echo "package.sh: debian/changelog says $version and meson.build says $meson_version;" >&2
  echo "add a debian/changelog entry (dch -v $meson_version) so that they agree" >&2
  exit 1
fi
profiles=()
case " $DEB_BUILD_OPTIONS " in *" nocheck "*) profiles=(-Pnocheck) ;; esac
dpkg-checkbuilddeps "${profiles[@]}" || {
  echo "package.sh: install the build dependencies above (scripts/deps.sh has them)" >&2
  exit 1
}

# What dh_clean would remove, without its sweep of editor backups through the
# tree; the staging dir and debhelper's stamps and snippets from a last run
# would otherwise be reused or appended to.
rm -rf debian/.debhelper debian/distkernel debian/files debian/debhelper-build-stamp \
  debian/*.substvars debian/*.debhelper debian/*.debhelper.log
debs=$BUILD/debs
mkdir -p "$debs"
rm -f "$debs"/*.deb

# As dpkg-buildpackage does: the DEB_{BUILD,HOST}_* architecture variables.
eval "$(dpkg-architecture --print-set)"
debian/rules DK_BUILDDIR="$BUILD" binary DK_DEBDIR="$PWD/$debs" >&2
deb=$(ls "$debs"/distkernel_"$version"_*.deb)

echo "== lintian $deb ==" >&2
lintian --fail-on error "$deb" >&2
echo "$deb"
