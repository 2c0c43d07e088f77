// Command asynq_worker is a plain asynq worker (an unmodified asynq.Server, nothing of
// periodic-manager in it) used to check that the tasks the manager's asynq target writes are
// dequeued, run, retried, archived and completed by asynq itself; and, in its second mode, that
// asynq's Inspector reads the scheduler entries and enqueue history the manager publishes.
//
//	go run . worker  -redis redis://127.0.0.1:6379/0 -queues default,mail [-fail demo:fail] [-sleep demo:slow=2s] [-out runs.jsonl]
//	go run . inspect -redis redis://127.0.0.1:6379/0 [-queues default,mail] [-history name,...]
//	go run . enqueue -redis redis://127.0.0.1:6379/0 -type T [-payload P] [-queue Q] [-id ID] [-unique 1m]
//	go run . version
//
// worker: each task run is one JSON line (type, payload, task id, retry count, max retry, queue,
// the handler's deadline, the time it ran) on stdout or in -out; tasks of the -fail type return an
// error, so asynq retries them (every -retry-delay) and archives them after their max retry;
// tasks of the -sleep type take the given time.
// SIGTERM or SIGINT stops it (asynq's graceful shutdown).
//
// enqueue: one task through asynq's own Client (Enqueue), and what asynq answered, as JSON: to
// see that asynq's client meets the manager's tasks (their ids, their uniqueness locks).
//
// version: the Go release and module versions built in, as JSON.
//
// inspect: one JSON document on stdout: asynq's scheduler entries (what `asynq cron ls` shows),
// each entry's enqueue events (`asynq cron history <id>`), and every task of the queues by state.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// run is one handler call, as written to the output.
type run struct {
	Type     string `json:"type"`
	Payload  string `json:"payload"`
	ID       string `json:"id"`
	Retry    int    `json:"retry"`
	MaxRetry int    `json:"max_retry"`
	Queue    string `json:"queue"`
	Deadline string `json:"deadline,omitempty"`
	At       string `json:"at"`
	Failed   bool   `json:"failed"`
}

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: asynq_worker worker|inspect|enqueue|version [flags]")
	}
	switch os.Args[1] {
	case "worker":
		worker(os.Args[2:])
	case "inspect":
		inspect(os.Args[2:])
	case "enqueue":
		enqueue(os.Args[2:])
	case "version":
		version()
	default:
		log.Fatalf("unknown mode %q: worker, inspect, enqueue or version", os.Args[1])
	}
}

func redisOpt(url string) asynq.RedisConnOpt {
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		log.Fatalf("-redis: %v", err)
	}
	return opt
}

func queueList(text string) []string {
	var out []string
	for _, q := range strings.Split(text, ",") {
		if q = strings.TrimSpace(q); q != "" {
			out = append(out, q)
		}
	}
	return out
}

func worker(args []string) {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	url := fs.String("redis", "redis://127.0.0.1:6379/0", "Redis URL of asynq")
	queues := fs.String("queues", "default", "comma-separated queues to serve")
	fail := fs.String("fail", "", "task type whose handler always returns an error")
	out := fs.String("out", "", "file for the JSON lines (default stdout)")
	delay := fs.Duration("retry-delay", time.Second, "delay before a failed task is retried")
	sleep := fs.String("sleep", "", "TYPE=DURATION: the handler of that type takes that long")
	_ = fs.Parse(args)
	slowType, slowFor := "", time.Duration(0)
	if *sleep != "" {
		parts := strings.SplitN(*sleep, "=", 2)
		d, err := time.ParseDuration(parts[len(parts)-1])
		if len(parts) != 2 || err != nil {
			log.Fatalf("-sleep %q: want TYPE=DURATION", *sleep)
		}
		slowType, slowFor = parts[0], d
	}

	sink := os.Stdout
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatalf("-out: %v", err)
		}
		defer f.Close()
		sink = f
	}

	weights := map[string]int{}
	for _, q := range queueList(*queues) {
		weights[q] = 1
	}
	srv := asynq.NewServer(redisOpt(*url), asynq.Config{
		Queues:         weights,
		Concurrency:    4,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return *delay },
		LogLevel:       asynq.WarnLevel,
	})
	if err := srv.Run(recorder(json.NewEncoder(sink), *fail, slowType, slowFor)); err != nil {
		log.Fatal(err)
	}
}

// recorder is the handler of every task: it writes the run as a JSON line to enc, then fails
// (tasks of type fail) or takes slowFor (tasks of type slowType) or succeeds at once.
func recorder(enc *json.Encoder, fail, slowType string, slowFor time.Duration) asynq.Handler {
	var mu sync.Mutex
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		r := run{Type: t.Type(), Payload: string(t.Payload()), At: time.Now().UTC().Format(time.RFC3339Nano)}
		r.ID, _ = asynq.GetTaskID(ctx)
		r.Retry, _ = asynq.GetRetryCount(ctx)
		r.MaxRetry, _ = asynq.GetMaxRetry(ctx)
		r.Queue, _ = asynq.GetQueueName(ctx)
		if d, ok := ctx.Deadline(); ok {
			r.Deadline = d.UTC().Format(time.RFC3339)
		}
		r.Failed = fail != "" && t.Type() == fail
		mu.Lock()
		err := enc.Encode(r)
		mu.Unlock()
		if err != nil {
			return err
		}
		if r.Failed {
			return errors.New("failing on purpose (-fail)")
		}
		if t.Type() == slowType {
			select {
			case <-time.After(slowFor):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
}

type entry struct {
	ID      string   `json:"id"`
	Spec    string   `json:"spec"`
	Type    string   `json:"type"`
	Payload string   `json:"payload"`
	Opts    []string `json:"opts"`
	Next    string   `json:"next"`
	Prev    string   `json:"prev"`
	History []event  `json:"history"`
}

type event struct {
	TaskID     string `json:"task_id"`
	EnqueuedAt string `json:"enqueued_at"`
}

type task struct {
	ID          string  `json:"id"`
	Queue       string  `json:"queue"`
	Type        string  `json:"type"`
	Payload     string  `json:"payload"`
	State       string  `json:"state"`
	MaxRetry    int     `json:"max_retry"`
	Retried     int     `json:"retried"`
	LastErr     string  `json:"last_err"`
	TimeoutS    float64 `json:"timeout_s"`
	Deadline    string  `json:"deadline"`
	RetentionS  float64 `json:"retention_s"`
	CompletedAt string  `json:"completed_at"`
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// events is an entry's enqueue history, newest first, as `asynq cron history` lists it.
func events(ins *asynq.Inspector, id string) []event {
	out := []event{}
	for page := 1; ; page++ {
		evs, err := ins.ListSchedulerEnqueueEvents(id, asynq.PageSize(500), asynq.Page(page))
		if err != nil {
			log.Fatalf("ListSchedulerEnqueueEvents(%s): %v", id, err)
		}
		for _, ev := range evs {
			out = append(out, event{TaskID: ev.TaskID, EnqueuedAt: stamp(ev.EnqueuedAt)})
		}
		if len(evs) < 500 {
			return out
		}
	}
}

func inspect(args []string) {
	fs := flag.NewFlagSet("inspect", flag.ExitOnError)
	url := fs.String("redis", "redis://127.0.0.1:6379/0", "Redis URL of asynq")
	queues := fs.String("queues", "", "comma-separated queues whose tasks to list (default: all)")
	history := fs.String("history", "", "comma-separated entry ids whose enqueue events to list "+
		"(also once no scheduler publishes them)")
	_ = fs.Parse(args)

	ins := asynq.NewInspector(redisOpt(*url))
	defer ins.Close()
	doc := struct {
		Entries []entry            `json:"entries"`
		Queues  []string           `json:"queues"`
		Tasks   []task             `json:"tasks"`
		History map[string][]event `json:"history"`
	}{Entries: []entry{}, Tasks: []task{}, History: map[string][]event{}}

	entries, err := ins.SchedulerEntries()
	if err != nil {
		log.Fatalf("SchedulerEntries: %v", err)
	}
	for _, e := range entries {
		item := entry{ID: e.ID, Spec: e.Spec, Type: e.Task.Type(), Payload: string(e.Task.Payload()),
			Next: stamp(e.Next), Prev: stamp(e.Prev), Opts: []string{}, History: []event{}}
		for _, o := range e.Opts {
			item.Opts = append(item.Opts, o.String())
		}
		item.History = events(ins, e.ID)
		doc.Entries = append(doc.Entries, item)
	}
	for _, id := range queueList(*history) {
		doc.History[id] = events(ins, id)
	}

	doc.Queues, err = ins.Queues()
	if err != nil {
		log.Fatalf("Queues: %v", err)
	}
	names := queueList(*queues)
	if len(names) == 0 {
		names = doc.Queues
	}
	type lister func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	listers := []lister{ins.ListPendingTasks, ins.ListActiveTasks, ins.ListScheduledTasks,
		ins.ListRetryTasks, ins.ListArchivedTasks, ins.ListCompletedTasks}
	for _, q := range names {
		for _, list := range listers {
			for page := 1; ; page++ {
				infos, err := list(q, asynq.PageSize(500), asynq.Page(page))
				if err != nil {
					log.Fatalf("listing tasks of %s: %v", q, err)
				}
				for _, ti := range infos {
					doc.Tasks = append(doc.Tasks, task{ID: ti.ID, Queue: ti.Queue, Type: ti.Type,
						Payload: string(ti.Payload), State: ti.State.String(), MaxRetry: ti.MaxRetry,
						Retried: ti.Retried, LastErr: ti.LastErr, TimeoutS: ti.Timeout.Seconds(),
						Deadline: stamp(ti.Deadline), RetentionS: ti.Retention.Seconds(),
						CompletedAt: stamp(ti.CompletedAt)})
				}
				if len(infos) < 500 {
					break
				}
			}
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(doc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// version prints the Go release the binary was built with and, for a module build, the
// versions of the modules in it (asynq's among them).
func version() {
	doc := struct {
		Go      string            `json:"go"`
		Modules map[string]string `json:"modules"`
	}{Go: runtime.Version(), Modules: map[string]string{}}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			doc.Modules[m.Path] = m.Version
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(doc)
}

// enqueue sends one task with asynq's Client and prints the outcome: "ok" with the task id, or
// asynq's refusal ("task_id_conflict", "duplicate_task") or another error's text.
func enqueue(args []string) {
	fs := flag.NewFlagSet("enqueue", flag.ExitOnError)
	url := fs.String("redis", "redis://127.0.0.1:6379/0", "Redis URL of asynq")
	typ := fs.String("type", "", "task type")
	payload := fs.String("payload", "", "payload (text)")
	queue := fs.String("queue", "default", "queue")
	id := fs.String("id", "", "task id (default: asynq's own)")
	unique := fs.Duration("unique", 0, "asynq's Unique option (0: none)")
	_ = fs.Parse(args)

	client := asynq.NewClient(redisOpt(*url))
	defer client.Close()
	opts := []asynq.Option{asynq.Queue(*queue)}
	if *id != "" {
		opts = append(opts, asynq.TaskID(*id))
	}
	if *unique > 0 {
		opts = append(opts, asynq.Unique(*unique))
	}
	out := struct {
		Outcome string `json:"outcome"`
		ID      string `json:"id"`
	}{}
	info, err := client.Enqueue(asynq.NewTask(*typ, []byte(*payload)), opts...)
	switch {
	case err == nil:
		out.Outcome, out.ID = "ok", info.ID
	case errors.Is(err, asynq.ErrTaskIDConflict):
		out.Outcome = "task_id_conflict"
	case errors.Is(err, asynq.ErrDuplicateTask):
		out.Outcome = "duplicate_task"
	default:
		out.Outcome = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
