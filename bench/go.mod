module github.com/protosaga/saga/bench

go 1.26.8

require github.com/protosaga/saga v0.0.0

require (
	github.com/bufbuild/protocompile v0.14.1 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/protosaga/saga => ../
