#!/usr/bin/env bash
# Session 25 run D (and E, after the fork check moved ahead of the step: forks_at): run A again with SchemaGrammar
# holding readings side by side (anyOf alternatives of one class);
# the schema of run A has no such anyOf, so this is the cost of the wrapper on the common path.
exec bash "$(dirname "$0")/s25a.sh"
