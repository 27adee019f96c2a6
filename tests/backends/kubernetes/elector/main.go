// Command elector campaigns for one coordination.k8s.io/v1 Lease with client-go's
// leaderelection, as every client-go controller does, and prints one line per transition:
//
//	campaigning IDENTITY
//	leader HOLDER        (client-go saw a new holder, possibly itself)
//	leading              (this process leads)
//	stopped              (this process no longer leads)
//
// SIGTERM or SIGINT releases the Lease (ReleaseOnCancel) and exits 0. A leader that fails
// to renew exits 1, as client-go controllers do.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file of the identity that campaigns")
	namespace := flag.String("namespace", "default", "namespace of the Lease")
	name := flag.String("lease", "", "name of the Lease")
	identity := flag.String("identity", "", "holderIdentity written while leading")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "client-go LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "client-go RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "client-go RetryPeriod")
	flag.Parse()
	if *name == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "elector: -lease and -identity are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "elector:", err)
		os.Exit(2)
	}
	client := kubernetes.NewForConfigOrDie(config)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	say("campaigning", *identity)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { say("leading") },
			OnStoppedLeading: func() { say("stopped") },
			OnNewLeader:      func(holder string) { say("leader", holder) },
		},
	})
	if ctx.Err() == nil {
		// RunOrDie returned without a signal: the renewal failed, leadership is lost.
		os.Exit(1)
	}
}

// say prints one transition line; os.Stdout is unbuffered, so a reader sees it at once.
func say(words ...any) {
	fmt.Println(words...)
}
