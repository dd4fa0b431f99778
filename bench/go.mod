module github.com/grpc-resilience/resilience/bench

go 1.26.0

replace github.com/grpc-resilience/resilience => ../
