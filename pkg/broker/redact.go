package broker

import "net/url"

// redact hides the password of an AMQP URL so it never reaches logs or errors.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable broker URL>"
	}
	return u.Redacted()
}
