package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threadsJava spawns threads that are all alive at once, has each do some
// arithmetic, checks the total, and writes and reads back a file in /tmp.
const threadsJava = `import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

public class Threads {
    static final int WORK = 200_000;

    static long work(int i) {
        long s = 0;
        for (int j = 0; j < WORK; j++) s += j ^ i;
        return s;
    }

    static final class Worker implements Runnable {
        final int i; final CountDownLatch started; final AtomicLong total;
        Worker(int i, CountDownLatch started, AtomicLong total) { this.i = i; this.started = started; this.total = total; }
        public void run() {
            started.countDown();
            try { started.await(); } catch (InterruptedException e) { throw new RuntimeException(e); }
            total.addAndGet(work(i));
        }
    }

    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        CountDownLatch started = new CountDownLatch(n);
        AtomicLong total = new AtomicLong();
        Thread[] ts = new Thread[n];
        for (int i = 0; i < n; i++) {
            ts[i] = new Thread(new Worker(i, started, total), "worker-" + i);
            ts[i].start();
        }
        for (Thread t : ts) t.join();
        long want = 0;
        for (int i = 0; i < n; i++) want += work(i);
        Path p = Files.createTempFile("threads", ".txt");
        Files.writeString(p, Long.toString(total.get()));
        String back = Files.readString(p);
        System.out.println("threads=" + n + " cpus=" + Runtime.getRuntime().availableProcessors()
            + " total=" + total.get() + " want=" + want + " tmpfile=" + p + " readback=" + back);
        System.exit(total.get() == want && back.equals(Long.toString(want)) ? 0 : 1);
    }
}
`

// TestJVM boots with the host's libraries shared read-only (which includes
// the JDKs under /usr/lib/jvm), runs `java -version` and a small program
// that spawns threads, and logs how long the boot and each JVM took.
func TestJVM(t *testing.T) {
	RequireShares(t)
	jdk, err := HostJDK(0)
	if err != nil {
		t.Skip(err)
	}
	t.Logf("JDK: %s", jdk)

	// Compiled on the host: javac under emulation would take far longer.
	// The classes (Threads and Threads$Worker) go in as a share of their own.
	src, classes := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "Threads.java"), []byte(threadsJava), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(jdk, "bin", "javac"), "-d", classes, filepath.Join(src, "Threads.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}

	opts := Options{
		MemoryMB: 2048,
		Shares:   map[string]string{"/app": classes},
		Command: []string{"sh", "-c", `
up() { cut -d' ' -f1 /proc/uptime; }
echo "@@ start $(up)"
t0=$(up); "$JAVA_HOME/bin/java" -version 2>&1 || exit 10; t1=$(up)
echo "@@ version $t0 $t1"
"$JAVA_HOME/bin/java" -cp /app Threads 8 || exit 11; t2=$(up)
echo "@@ threads $t1 $t2"
ls /tmp
`},
		Env: []string{"JAVA_HOME=" + jdk},
	}
	if err := opts.ShareHostLibraries(); err != nil {
		t.Fatal(err)
	}
	if !sharedInGuest(opts, jdk) {
		opts.Shares[jdk] = jdk // a JDK outside /usr/lib
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(res.Output), "\n") {
		t.Log("guest: " + l)
	}
	if res.ExitCode != 0 {
		t.Fatalf("guest command exited %d", res.ExitCode)
	}
	if !strings.Contains(res.Output, "64-Bit Server VM") {
		t.Errorf("java -version printed no Server VM line")
	}
	if !strings.Contains(res.Output, "threads=8 ") || !strings.Contains(res.Output, "hsperfdata_root") {
		t.Errorf("Threads did not report, or /tmp lacks the JVM's hsperfdata")
	}
	marks := map[string][]float64{}
	for _, l := range strings.Split(res.Output, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "@@" {
			for _, x := range f[2:] {
				v, _ := strconv.ParseFloat(x, 64)
				marks[f[1]] = append(marks[f[1]], v)
			}
		}
	}
	span := func(k string) time.Duration {
		if v := marks[k]; len(v) == 2 {
			return time.Duration((v[1] - v[0]) * float64(time.Second)).Round(10 * time.Millisecond)
		}
		return -1
	}
	var start time.Duration
	if v := marks["start"]; len(v) == 1 {
		start = time.Duration(v[0] * float64(time.Second)).Round(10 * time.Millisecond)
	}
	t.Logf("guest uptime at command start %v (modules loaded, shares mounted); java -version %v; Threads 8 %v; boot to poweroff %v",
		start, span("version"), span("threads"), res.Boot.Round(time.Millisecond))
}

// sharedInGuest reports whether host directory dir is visible in the guest
// at the same path through opts.Shares.
func sharedInGuest(opts Options, dir string) bool {
	for g, h := range opts.Shares {
		if g == h && (dir == h || strings.HasPrefix(dir, h+"/")) {
			return true
		}
	}
	return false
}
