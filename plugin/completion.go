package plugin

import (
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// completePods completes the names of running pods in the namespace.
func completePods(o *RootOptions) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		client, ns, err := o.clientAndNamespace()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		pods, err := client.CoreV1().Pods(ns).List(cmd.Context(), metav1.ListOptions{FieldSelector: "status.phase=Running"})
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []cobra.Completion
		for _, p := range pods.Items {
			names = append(names, cobra.CompletionWithDesc(p.Name, "on "+p.Spec.NodeName))
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNodes completes node names.
func completeNodes(o *RootOptions) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		client, _, err := o.clientAndNamespace()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		nodes, err := client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []cobra.Completion
		for _, n := range nodes.Items {
			names = append(names, n.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// clientAndNamespace builds a client from the kubeconfig flags.
func (o *RootOptions) clientAndNamespace() (kubernetes.Interface, string, error) {
	ns, _, err := o.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", err
	}
	client, err := o.NewClient()
	return client, ns, err
}
