module bootplate.dev/tests/tools/pause

go 1.26.0
