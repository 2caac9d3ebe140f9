package nodesetup

import (
	"context"
	"fmt"

	"os"
	"strconv"

	"github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// restartUnit has systemd (its private socket at socket) restart unit, as
// systemctl restart does, and waits for the job to finish.
func restartUnit(ctx context.Context, socket, unit string) error {
	conn, err := dbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial("unix:path="+socket, godbus.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		return fmt.Errorf("reach systemd: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := conn.RestartUnitContext(ctx, unit, "replace", done); err != nil {
		return fmt.Errorf("restart %s: %w", unit, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("systemd's restart of %s ended %q", unit, result)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
