module phaseprof.test/goroutinessim

go 1.19
