package client

import "context"

// CheckAgent runs the background loop's check for a gone agent once.
func (c *Client) CheckAgent() { c.checkAgent(context.Background()) }

// LocalWaiting is the number of threads waiting in turn for a held slot.
func (c *Client) LocalWaiting() int { return int(c.local.waiting.Load()) }

// AfterGrant makes f run between each HOLD grant's answer and its publish
// in the table. Set it before the first Acquire.
func (c *Client) AfterGrant(f func(quotaMilli uint32)) { c.local.afterGrant = f }
