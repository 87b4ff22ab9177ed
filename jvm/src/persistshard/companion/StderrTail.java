package persistshard.companion;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.concurrent.TimeUnit;

/**
 * The last lines a long-lived bridge process wrote to its stderr. A daemon thread of its own
 * drains the pipe, so it never fills up and stalls the process; what the process said is kept
 * after it ends, for the error that reports its end.
 */
final class StderrTail {
  private final ArrayDeque<String> lines = new ArrayDeque<>();
  private final int keep;

  StderrTail(Process process, int keep, String threadName) {
    this.keep = keep;
    Thread drainer = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(
          new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          synchronized (lines) {
            lines.addLast(line);
            if (lines.size() > this.keep) {
              lines.removeFirst();
            }
          }
        }
      } catch (IOException e) {
        // the process is gone: what it said is kept
      }
    }, threadName);
    drainer.setDaemon(true);
    drainer.start();
  }

  /** The kept lines, oldest first. */
  String text() {
    synchronized (lines) {
      return String.join("\n", lines);
    }
  }

  /** Kills {@code process} if it still runs and waits up to 10 s for it to end. */
  static void kill(Process process) {
    if (process.isAlive()) {
      process.destroyForcibly();
      try {
        process.waitFor(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
