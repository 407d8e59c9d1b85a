module phaseprof.test/relaysim

go 1.19
