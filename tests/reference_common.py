"""What the Python references in tests/ share: a tally of checks, and running a command that
must exit as expected (the reference's name, from its file, in the message)."""
import os
import subprocess
import sys


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, what):
        print("  %-4s %s" % ("ok" if ok else "FAIL", what))
        if not ok:
            self.items.append(what)
        return ok

    def verdict(self, passed):
        """The exit code: 1 after listing the failed checks, else 0 after `PASS: passed`."""
        if self.items:
            print("\nFAILED (%d):" % len(self.items))
            for f in self.items:
                print("  " + f)
            return 1
        print("\nPASS: " + passed)
        return 0


def run(cmd, cwd, what, expect=0):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    if p.returncode != expect:
        sys.stdout.write(p.stdout[-3000:] + p.stderr[-3000:])
        name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
        sys.exit("%s: %s exited %d, expected %d: %s" % (name, what, p.returncode, expect, " ".join(cmd)))
    return p
