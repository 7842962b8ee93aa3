#!/usr/bin/env bash
# Session 25 run B: run A again after the redraw checks only the tokens whose first byte the grammar allows
# (Generator::Impl::json_redraw), and with the shared string / number lexers (runtime/json_lexer.h).
exec bash "$(dirname "$0")/s25a.sh"
