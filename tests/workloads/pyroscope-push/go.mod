module phaseprof.test/pyroscopepush

go 1.26.0

require (
	github.com/google/pprof v0.0.0-20261105003125-4bf881d7fb0b
	github.com/grafana/pyroscope-go v1.5.0
)

require (
	github.com/grafana/pyroscope-go/godeltaprof v0.1.12 // indirect
	github.com/klauspost/compress v1.20.2 // indirect
)
