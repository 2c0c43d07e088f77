module example.com/asynq_worker

go 1.19

require github.com/hibiken/asynq v0.24.1
