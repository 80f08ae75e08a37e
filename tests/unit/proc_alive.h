/*
 * Whether a process still runs, for the suites that check that what the
 * runtime started is gone (test_proc.c, test_server.c).
 */
#ifndef PROC_ALIVE_H
#define PROC_ALIVE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Whether PID runs. A zombie does not: this container's init may never reap
 * what is reparented to it. */
__attribute__((unused)) static bool alive(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool zombie = false;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "State:", 6) == 0)
            zombie = strchr(line, 'Z') != NULL;
    fclose(f);
    return !zombie;
}

/* Whether PID is gone within MS milliseconds. */
__attribute__((unused)) static bool gone_within(int pid, int ms)
{
    for (int i = 0; i < ms / 20 && alive(pid); i++)
        usleep(20000);
    return !alive(pid);
}

#endif
