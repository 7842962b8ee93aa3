# Sourced by the device scripts: unpacks the binaries packed by scripts/pack_device.sh from $P into $B, puts the
# libcpp-httplib beside them on the library path, links the build's source folder to this checkout (the tests read
# tests/models through it) and unpacks the committed fixture extracts where the build expects them.
# Usage: P=.device/r1 B=/tmp/bins; . scripts/device_unpack.sh
mkdir -p "$B" && xz -dc "$P/bins.tar.xz" | tar xf - -C "$B"
export LD_LIBRARY_PATH=$PWD/$P:${LD_LIBRARY_PATH:-}
src=$(cat "$P/source_dir" 2>/dev/null)
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
bd=$(cat "$P/build_dir" 2>/dev/null)
if [ -n "$bd" ]; then
  mkdir -p "$bd/tests/shared_extract"
  for x in tests/fixtures/shared_extract/*.tar.xz; do [ -f "$x" ] && tar xJf "$x" -C "$bd/tests/shared_extract"; done
fi
