module bootplate.dev/bench/render

go 1.19
