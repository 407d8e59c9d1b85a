module phaseprof.test/gospin

go 1.19
