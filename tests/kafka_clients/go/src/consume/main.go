// Reads a callgate events topic with Sarama, a stock Go Kafka client, and prints one JSON line per
// record: where it was, its CloudEvents type header, the event's fields that identify it, the `hash`
// it carries and the SHA-256 recomputed from its bytes (docs/events.md, *Checking*); then one line
// with each partition's high watermark from the fetch responses. Usage: consume BOOTSTRAP TOPIC COUNT
//
// Sarama decodes zstd itself (through libzstd) once Config.Version is 2.1 or later; each partition
// is started at offset 0 and read until COUNT records arrived.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/Shopify/sarama"
)

var hashSuffix = regexp.MustCompile(`^,"hash":"([0-9a-f]{64})"\}$`)

type event struct {
	EventID    string `json:"event_id"`
	ProducerID string `json:"producer_id"`
	Seq        int64  `json:"seq"`
	Type       string `json:"type"`
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func line(m *sarama.ConsumerMessage) map[string]interface{} {
	wire := m.Value
	var e event
	if err := json.Unmarshal(wire, &e); err != nil {
		fail("partition %d offset %d: not JSON: %v", m.Partition, m.Offset, err)
	}
	var carried interface{}
	if match := hashSuffix.FindSubmatch(wire[len(wire)-75:]); match != nil {
		carried = string(match[1])
	}
	body := append(append([]byte{}, wire[:len(wire)-75]...), '}')
	sum := sha256.Sum256(body)
	var ceType interface{}
	for _, h := range m.Headers {
		if string(h.Key) == "ce_type" {
			ceType = string(h.Value)
		}
	}
	return map[string]interface{}{
		"partition": m.Partition, "offset": m.Offset, "key": string(m.Key), "ce_type": ceType,
		"event_id": e.EventID, "producer_id": e.ProducerID, "seq": e.Seq, "type": e.Type,
		"hash": carried, "recomputed": hex.EncodeToString(sum[:]),
	}
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: consume BOOTSTRAP TOPIC COUNT")
		os.Exit(2)
	}
	bootstrap, topic := os.Args[1], os.Args[2]
	count, err := strconv.Atoi(os.Args[3])
	if err != nil {
		fail("COUNT: %v", err)
	}
	config := sarama.NewConfig()
	config.ClientID = "callgate-go-reader"
	config.Version = sarama.V2_1_0_0 // the first version whose fetch requests accept zstd batches
	consumer, err := sarama.NewConsumer([]string{bootstrap}, config)
	if err != nil {
		fail("connect: %v", err)
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(topic)
	if err != nil {
		fail("partitions of %s: %v", topic, err)
	}
	messages := make(chan *sarama.ConsumerMessage)
	errs := make(chan error)
	readers := map[int32]sarama.PartitionConsumer{}
	for _, p := range partitions {
		reader, err := consumer.ConsumePartition(topic, p, 0)
		if err != nil {
			fail("partition %d: %v", p, err)
		}
		readers[p] = reader
		go func(r sarama.PartitionConsumer) {
			for m := range r.Messages() {
				messages <- m
			}
		}(reader)
		go func(r sarama.PartitionConsumer) {
			for e := range r.Errors() {
				errs <- e
			}
		}(reader)
	}
	out := json.NewEncoder(os.Stdout)
	deadline := time.After(30 * time.Second)
	for read := 0; read < count; read++ {
		select {
		case m := <-messages:
			out.Encode(line(m))
		case err := <-errs:
			fail("%v", err)
		case <-deadline:
			fail("timed out after %d of %d records", read, count)
		}
	}
	ends := map[string]int64{}
	for p, r := range readers {
		ends[strconv.Itoa(int(p))] = r.HighWaterMarkOffset()
	}
	out.Encode(map[string]interface{}{"high_watermarks": ends})
}
