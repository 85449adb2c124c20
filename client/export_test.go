package client

import "context"

// CheckAgent runs the background loop's check for a gone agent once.
func (c *Client) CheckAgent() { c.checkAgent(context.Background()) }
