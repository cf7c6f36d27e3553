#!/usr/bin/env bash
# Draws the app and tray icons into icons/ (top level) with ImageMagick (the PNGs are
# committed; rerun after changing the design).
#   tray/mac/*.png    44x44, black: template images macOS tints for light/dark menu bars
#   tray/linux/*.png  44x44, mid-grey so they read on light and dark panels
# States: idle (loading or paused), normal, warn, critical, error.
set -euo pipefail
cd "$(dirname "$0")/../icons"
mkdir -p tray/mac tray/linux

bars() { # colour opacity: three rising bars
  local c=$1 o=$2
  args=(-fill "$c" -draw "fill-opacity $o roundrectangle 8,24 15,38 2,2"
        -draw "fill-opacity $o roundrectangle 19,15 26,38 2,2" -draw "fill-opacity $o roundrectangle 30,6 37,38 2,2")
}
for set in mac linux; do
  colour=black; [ $set = linux ] && colour='#8a8a8a'
  bars "$colour" 0.45; convert -size 44x44 xc:none "${args[@]}" tray/$set/idle.png
  bars "$colour" 1; convert -size 44x44 xc:none "${args[@]}" tray/$set/normal.png
  bars "$colour" 1; convert -size 44x44 xc:none "${args[@]}" -fill '#f5a623' -draw "circle 8,8 8,2" tray/$set/warn.png
  bars "$colour" 1; convert -size 44x44 xc:none "${args[@]}" -fill '#e5484d' -draw "circle 8,8 8,2" tray/$set/critical.png
  bars "$colour" 0.45; convert -size 44x44 xc:none "${args[@]}" -stroke '#e5484d' -strokewidth 4 -draw "line 3,3 14,14" -draw "line 14,3 3,14" tray/$set/error.png
done

# App icon: white bars on a blue rounded square.
convert -size 1024x1024 xc:none \
  -fill '#0a5fd8' -draw "roundrectangle 64,64 960,960 200,200" \
  -fill white -draw "roundrectangle 260,560 390,800 30,30" -draw "roundrectangle 447,400 577,800 30,30" -draw "roundrectangle 634,240 764,800 30,30" \
  icon.png
for s in 32 128; do convert icon.png -resize ${s}x${s} ${s}x${s}.png; done
convert icon.png -resize 256x256 128x128@2x.png
echo "icons written to $(pwd)"
