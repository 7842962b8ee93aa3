#!/usr/bin/env bash
# Session 25 run C: run A again with the redraw's allowed tokens found by a walk over the vocabulary in byte order
# (runtime/vocab_walk.h: the states after shared prefixes reused, a refused prefix skipped whole).
exec bash "$(dirname "$0")/s25a.sh"
