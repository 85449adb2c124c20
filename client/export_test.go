package client

import "context"

// CheckAgent runs the background loop's check for a gone agent once.
func (c *Client) CheckAgent() { c.checkAgent(context.Background()) }

// LocalWaiting is the number of threads waiting in turn for a held slot.
func (c *Client) LocalWaiting() int { return int(c.local.waiting.Load()) }
