// Command clientv3check drives etcd's own Go client recipes (clientv3's
// concurrency package: Mutex, Election and STM) from many goroutines
// against every member of a cluster serving etcd 3.4's v3 API, and checks
// what they promise:
//
//   - Mutex: goroutines take one mutex in turn; inside it nobody else is
//     (an in-process flag), a store write made under the mutex's
//     ownership compare is the one read back, and a counter incremented
//     without atomics ends at the number of acquisitions.
//   - Election: campaigners win, check that no other believes it leads and
//     that Leader() (asked through another member) names them, then
//     resign, round after round.
//   - STM: a bank of accounts under each isolation level (serializable
//     snapshot, serializable, repeatable reads); goroutines move money
//     between accounts while auditors sum them inside STM transactions;
//     every committed audit and the final balances keep the total, and no
//     account goes negative.
//
// Every loop is bounded in count, every call by a timeout, and the whole
// run by -deadline. Any violation or error is printed and the exit status
// is 1 (2 for bad flags). Built offline in GOPATH mode against Debian's
// golang-etcd-server-dev (deploy/etcd/clientv3/run.py does it).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.uber.org/zap"
)

// The largest numbers the flags accept: enough for a stress run, small
// enough that a typo cannot start an endless one.
const (
	workersMax    = 256
	iterationsMax = 10000
	accountsMax   = 1000
	// A session's lease TTL in seconds: long enough that a loaded machine
	// does not lose it between keep-alives.
	sessionTTL = 15
	// Audits per isolation level's auditor goroutine, at most.
	auditsPerAuditor = 50
)

type config struct {
	endpoints  []string
	workers    int
	iterations int
	accounts   int
	callWait   time.Duration
	prefix     string
}

// run holds what every check shares: one client per member, the deadline
// and the violations found.
type run struct {
	config
	clients []*clientv3.Client
	ctx     context.Context

	mu         sync.Mutex
	violations []string
}

func (r *run) fail(format string, args ...interface{}) {
	message := fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	// Keep the report readable: the first violations tell the story.
	if len(r.violations) < 50 {
		r.violations = append(r.violations, message)
	}
}

func (r *run) failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.violations) > 0
}

// client gives goroutine i a member's client, spreading them over all.
func (r *run) client(i int) *clientv3.Client {
	return r.clients[i%len(r.clients)]
}

// call is a context for one call: -call-timeout, within the deadline.
func (r *run) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, r.callWait)
}

func (r *run) session(i int) (*concurrency.Session, error) {
	return concurrency.NewSession(r.client(i), concurrency.WithTTL(sessionTTL),
		concurrency.WithContext(r.ctx))
}

// checkMutex: workers goroutines take the same mutex iterations times each.
func (r *run) checkMutex() {
	name := r.prefix + "/mutex"
	owner := r.prefix + "/mutex-owner"
	var inside int32
	counter := 0 // guarded by the etcd mutex alone, on purpose
	var wg sync.WaitGroup
	for w := 0; w < r.workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			session, err := r.session(w)
			if err != nil {
				r.fail("mutex worker %d: session: %v", w, err)
				return
			}
			defer session.Close()
			mutex := concurrency.NewMutex(session, name)
			me := fmt.Sprintf("worker-%d", w)
			for i := 0; i < r.iterations && !r.failed(); i++ {
				ctx, cancel := r.call()
				if err := mutex.Lock(ctx); err != nil {
					cancel()
					r.fail("mutex worker %d: lock %d: %v", w, i, err)
					return
				}
				if !atomic.CompareAndSwapInt32(&inside, 0, 1) {
					r.fail("mutex worker %d: lock %d taken while another goroutine holds it", w, i)
				}
				before := counter
				// Under the mutex's ownership compare: a holder that is not
				// the owner any more writes nothing.
				txn, err := r.client(w).Txn(ctx).If(mutex.IsOwner()).
					Then(clientv3.OpPut(owner, me)).Commit()
				switch {
				case err != nil:
					r.fail("mutex worker %d: owner write %d: %v", w, i, err)
				case !txn.Succeeded:
					r.fail("mutex worker %d: lock %d held but its key is not the owner", w, i)
				}
				read, err := r.client(w+1).Get(ctx, owner)
				switch {
				case err != nil:
					r.fail("mutex worker %d: owner read %d: %v", w, i, err)
				case len(read.Kvs) != 1 || string(read.Kvs[0].Value) != me:
					r.fail("mutex worker %d: lock %d: another member reads owner %q, not %q",
						w, i, values(read), me)
				}
				counter = before + 1
				atomic.StoreInt32(&inside, 0)
				if err := mutex.Unlock(ctx); err != nil {
					r.fail("mutex worker %d: unlock %d: %v", w, i, err)
					cancel()
					return
				}
				cancel()
			}
		}(w)
	}
	wg.Wait()
	want := r.workers * r.iterations
	if !r.failed() && counter != want {
		r.fail("mutex: counter %d after %d acquisitions: two holders overlapped", counter, want)
	}
	fmt.Printf("mutex: %d goroutines x %d acquisitions, counter %d\n", r.workers, r.iterations, counter)
}

func values(response *clientv3.GetResponse) []string {
	if response == nil {
		return nil
	}
	out := make([]string, 0, len(response.Kvs))
	for _, kv := range response.Kvs {
		out = append(out, string(kv.Value))
	}
	return out
}

// checkElection: campaigners win, check they alone lead, and resign.
func (r *run) checkElection() {
	name := r.prefix + "/election"
	campaigners := r.workers
	if campaigners > 8 {
		campaigners = 8
	}
	rounds := r.iterations
	var leaders int32
	var won int64
	var wg sync.WaitGroup
	for c := 0; c < campaigners; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			session, err := r.session(c)
			if err != nil {
				r.fail("campaigner %d: session: %v", c, err)
				return
			}
			defer session.Close()
			election := concurrency.NewElection(session, name)
			me := fmt.Sprintf("campaigner-%d", c)
			for round := 0; round < rounds && !r.failed(); round++ {
				ctx, cancel := r.call()
				if err := election.Campaign(ctx, me); err != nil {
					cancel()
					r.fail("campaigner %d: campaign %d: %v", c, round, err)
					return
				}
				if n := atomic.AddInt32(&leaders, 1); n != 1 {
					r.fail("campaigner %d: round %d: %d campaigners believe they lead", c, round, n)
				}
				atomic.AddInt64(&won, 1)
				leader, err := election.Leader(ctx)
				switch {
				case err != nil:
					r.fail("campaigner %d: leader %d: %v", c, round, err)
				case len(leader.Kvs) != 1 || string(leader.Kvs[0].Value) != me:
					r.fail("campaigner %d: round %d: Leader() says %q", c, round, values(leader))
				}
				// What Leader() reads, through another member.
				other, err := r.client(c+1).Get(ctx, name+"/",
					append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...)
				switch {
				case err != nil:
					r.fail("campaigner %d: leader read %d: %v", c, round, err)
				case len(other.Kvs) != 1 || string(other.Kvs[0].Value) != me:
					r.fail("campaigner %d: round %d: another member says the leader is %q",
						c, round, values(other))
				}
				select {
				case <-session.Done():
					r.fail("campaigner %d: round %d: the session's lease ended while leading", c, round)
				default:
				}
				atomic.AddInt32(&leaders, -1)
				if err := election.Resign(ctx); err != nil {
					r.fail("campaigner %d: resign %d: %v", c, round, err)
					cancel()
					return
				}
				cancel()
			}
		}(c)
	}
	wg.Wait()
	if !r.failed() && won != int64(campaigners*rounds) {
		r.fail("election: %d wins, expected %d", won, campaigners*rounds)
	}
	fmt.Printf("election: %d campaigners x %d rounds, %d wins, never two leaders\n",
		campaigners, rounds, won)
}

type level struct {
	name      string
	isolation concurrency.Isolation
}

var levels = []level{
	{"serializable-snapshot", concurrency.SerializableSnapshot},
	{"serializable", concurrency.Serializable},
	{"repeatable-reads", concurrency.RepeatableReads},
}

const startBalance = 100

// checkBank: transfers and audits under one isolation level.
func (r *run) checkBank(lvl level) {
	bank := r.prefix + "/bank/" + lvl.name + "/"
	account := func(i int) string { return fmt.Sprintf("%sacct-%03d", bank, i) }
	total := startBalance * r.accounts
	{
		ctx, cancel := r.call()
		for i := 0; i < r.accounts; i++ {
			if _, err := r.client(i).Put(ctx, account(i), strconv.Itoa(startBalance)); err != nil {
				r.fail("bank %s: open account %d: %v", lvl.name, i, err)
				cancel()
				return
			}
		}
		cancel()
	}
	// STM's first read is serializable: a member that has not applied the
	// accounts yet would answer them absent. Each member's own state holds
	// them all before any transfer starts (they are never deleted).
	for i := range r.clients {
		for {
			ctx, cancel := r.call()
			got, err := r.client(i).Get(ctx, bank, clientv3.WithPrefix(),
				clientv3.WithSerializable(), clientv3.WithCountOnly())
			cancel()
			if err == nil && got.Count == int64(r.accounts) {
				break
			}
			if r.ctx.Err() != nil {
				r.fail("bank %s: member %d never served the %d accounts", lvl.name, i+1, r.accounts)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	balance := func(s concurrency.STM, key string) int {
		text := s.Get(key)
		n, err := strconv.Atoi(text)
		if err != nil {
			panic(fmt.Sprintf("bank %s: %s holds %q", lvl.name, key, text))
		}
		return n
	}
	var transfers, skipped, audits int64
	var wg sync.WaitGroup
	for w := 0; w < r.workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			random := rand.New(rand.NewSource(int64(w) + 1))
			for i := 0; i < r.iterations && !r.failed(); i++ {
				from := random.Intn(r.accounts)
				to := (from + 1 + random.Intn(r.accounts-1)) % r.accounts
				amount := 1 + random.Intn(30)
				moved := false
				ctx, cancel := r.call()
				_, err := concurrency.NewSTM(r.client(w), func(s concurrency.STM) error {
					moved = false
					have := balance(s, account(from))
					other := balance(s, account(to))
					if have < amount {
						return nil
					}
					s.Put(account(from), strconv.Itoa(have-amount))
					s.Put(account(to), strconv.Itoa(other+amount))
					moved = true
					return nil
				}, concurrency.WithIsolation(lvl.isolation), concurrency.WithAbortContext(ctx))
				cancel()
				if err != nil {
					r.fail("bank %s: worker %d: transfer %d: %v", lvl.name, w, i, err)
					return
				}
				if moved {
					atomic.AddInt64(&transfers, 1)
				} else {
					atomic.AddInt64(&skipped, 1)
				}
			}
		}(w)
	}
	// Auditors: a read-only STM sees a total that is kept.
	stop := make(chan struct{})
	var auditors sync.WaitGroup
	for a := 0; a < 2; a++ {
		auditors.Add(1)
		go func(a int) {
			defer auditors.Done()
			for i := 0; i < auditsPerAuditor && !r.failed(); i++ {
				select {
				case <-stop:
					return
				default:
				}
				sum, negative := 0, ""
				ctx, cancel := r.call()
				_, err := concurrency.NewSTM(r.client(a+1), func(s concurrency.STM) error {
					sum, negative = 0, ""
					for k := 0; k < r.accounts; k++ {
						n := balance(s, account(k))
						if n < 0 {
							negative = account(k)
						}
						sum += n
					}
					return nil
				}, concurrency.WithIsolation(lvl.isolation), concurrency.WithAbortContext(ctx))
				cancel()
				if err != nil {
					r.fail("bank %s: auditor %d: audit %d: %v", lvl.name, a, i, err)
					return
				}
				atomic.AddInt64(&audits, 1)
				if sum != total || negative != "" {
					r.fail("bank %s: audit %d saw a total of %d (want %d), negative account %q",
						lvl.name, i, sum, total, negative)
				}
			}
		}(a)
	}
	wg.Wait()
	close(stop)
	auditors.Wait()
	ctx, cancel := r.call()
	defer cancel()
	final, err := r.client(0).Get(ctx, bank, clientv3.WithPrefix())
	if err != nil {
		r.fail("bank %s: final read: %v", lvl.name, err)
		return
	}
	sum := 0
	for _, kv := range final.Kvs {
		n, err := strconv.Atoi(string(kv.Value))
		if err != nil || n < 0 {
			r.fail("bank %s: account %s ends at %q", lvl.name, kv.Key, kv.Value)
		}
		sum += n
	}
	if len(final.Kvs) != r.accounts || sum != total {
		r.fail("bank %s: %d accounts hold %d in all, want %d holding %d",
			lvl.name, len(final.Kvs), sum, r.accounts, total)
	}
	fmt.Printf("stm %s: %d transfers, %d refused for funds, %d audits, total %d of %d\n",
		lvl.name, transfers, skipped, audits, sum, total)
}

func parse() (config, time.Duration, error) {
	var c config
	endpoints := flag.String("endpoints", "127.0.0.1:2379",
		"comma-separated etcd endpoints (every member); goroutines are spread over them")
	flag.IntVar(&c.workers, "workers", 6, "goroutines per check")
	flag.IntVar(&c.iterations, "iterations", 15, "acquisitions, rounds or transfers per goroutine")
	flag.IntVar(&c.accounts, "accounts", 10, "bank accounts per isolation level")
	flag.DurationVar(&c.callWait, "call-timeout", 30*time.Second, "the longest any one call may take")
	deadline := flag.Duration("deadline", 120*time.Second, "the longest the whole run may take")
	flag.StringVar(&c.prefix, "prefix", fmt.Sprintf("/clientv3check/%d", time.Now().UnixNano()),
		"the key prefix the run uses")
	flag.Parse()
	for _, e := range strings.Split(*endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			c.endpoints = append(c.endpoints, e)
		}
	}
	switch {
	case len(c.endpoints) == 0:
		return c, 0, fmt.Errorf("-endpoints names no endpoint")
	case c.workers < 1 || c.workers > workersMax:
		return c, 0, fmt.Errorf("-workers is %d: 1 to %d", c.workers, workersMax)
	case c.iterations < 1 || c.iterations > iterationsMax:
		return c, 0, fmt.Errorf("-iterations is %d: 1 to %d", c.iterations, iterationsMax)
	case c.accounts < 2 || c.accounts > accountsMax:
		return c, 0, fmt.Errorf("-accounts is %d: 2 to %d", c.accounts, accountsMax)
	case *deadline <= 0 || c.callWait <= 0:
		return c, 0, fmt.Errorf("-deadline and -call-timeout must be positive")
	}
	return c, *deadline, nil
}

func main() {
	cfg, deadline, err := parse()
	if err != nil {
		fmt.Fprintf(os.Stderr, "clientv3check: %v\n", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	r := &run{config: cfg, ctx: ctx}
	// The client's own log: errors only (its retries are expected).
	logs := zap.NewProductionConfig()
	logs.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	for _, endpoint := range cfg.endpoints {
		client, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{endpoint},
			DialTimeout: 10 * time.Second,
			LogConfig:   &logs,
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "clientv3check: connect %s: %v\n", endpoint, err)
			os.Exit(1)
		}
		defer client.Close()
		r.clients = append(r.clients, client)
	}
	started := time.Now()
	fmt.Printf("clientv3check: %d endpoints %v, %d goroutines, %d iterations, prefix %s\n",
		len(cfg.endpoints), cfg.endpoints, cfg.workers, cfg.iterations, cfg.prefix)
	checks := []struct {
		name string
		run  func()
	}{
		{"mutex", r.checkMutex},
		{"election", r.checkElection},
	}
	for _, lvl := range levels {
		lvl := lvl
		checks = append(checks, struct {
			name string
			run  func()
		}{"stm " + lvl.name, func() { r.checkBank(lvl) }})
	}
	for _, check := range checks {
		if r.failed() {
			break
		}
		begun := time.Now()
		check.run()
		fmt.Printf("  (%s took %.1fs)\n", check.name, time.Since(begun).Seconds())
	}
	if ctx.Err() != nil {
		r.fail("the run passed its deadline of %s", deadline)
	}
	if r.failed() {
		fmt.Fprintf(os.Stderr, "clientv3check: FAILED after %.1fs:\n", time.Since(started).Seconds())
		for _, v := range r.violations {
			fmt.Fprintf(os.Stderr, "  %s\n", v)
		}
		os.Exit(1)
	}
	fmt.Printf("clientv3check: all checks passed in %.1fs\n", time.Since(started).Seconds())
}
